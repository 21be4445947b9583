"""The great-expectations 1.x suite for canonical preference records.

GX checks what it expresses well, column by column: the columns exist, ``kind`` is one of
the contract's shapes, prompts are present, pair and scored fields are present for their
kind, scores lie in [0, 1] and texts fit ``max_chars``. Row-level failures come back with
their row index and are mapped to the same reason codes the Python checks use.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from alignflow.data.issues import Reason
from alignflow.data.schema import RecordKind

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

SUITE_NAME = "alignflow_preference_data"
GX_COLUMNS = ("kind", "prompt", "chosen", "rejected", "completion", "score")
_TEXT = ("prompt", "chosen", "rejected", "completion")


@dataclass
class RowFailure:
    index: int
    code: Reason
    field: str
    message: str


def build_suite(max_chars: int):
    """The expectation suite, built in code so that it follows the config (``max_chars``)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    suite = gx.ExpectationSuite(name=SUITE_NAME)
    for column in GX_COLUMNS:
        suite.add_expectation(gxe.ExpectColumnToExist(column=column))
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeInSet(column="kind", value_set=[str(k) for k in RecordKind])
    )
    suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column="prompt"))
    for column, kind in (
        ("chosen", "pair"),
        ("rejected", "pair"),
        ("completion", "scored"),
        ("score", "scored"),
    ):
        suite.add_expectation(
            gxe.ExpectColumnValuesToNotBeNull(
                column=column, row_condition=f'kind=="{kind}"', condition_parser="pandas"
            )
        )
    suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(column="score", min_value=0.0, max_value=1.0))
    for column in _TEXT:
        suite.add_expectation(gxe.ExpectColumnValueLengthsToBeBetween(column=column, max_value=max_chars))
    return suite


def _reason(expectation_type: str, column: str | None) -> Reason:
    if expectation_type == "expect_column_values_to_be_between" and column == "score":
        return Reason.SCORE_OUT_OF_RANGE
    if expectation_type == "expect_column_value_lengths_to_be_between":
        return Reason.TOO_LONG_CHARS
    if expectation_type == "expect_column_values_to_not_be_null":
        return Reason.MISSING_FIELD
    if expectation_type == "expect_column_values_to_be_in_set":
        return Reason.UNKNOWN_SHAPE
    return Reason.EXPECTATION_FAILED


def _message(
    expectation_type: str, column: str | None, kwargs: dict[str, Any], frame: pd.DataFrame, index: int
) -> str:
    value = frame.at[index, column] if column in frame.columns else None
    if expectation_type == "expect_column_value_lengths_to_be_between":
        assert value is not None  # only a set value can be too long
        return f"{column!r} has {len(value)} characters > {kwargs.get('max_value')}"
    if expectation_type == "expect_column_values_to_be_between":
        return f"{column} {value} is outside [{kwargs.get('min_value')}, {kwargs.get('max_value')}]"
    return f"{column!r} fails {expectation_type} (value {str(value)[:80]!r})"


def run_expectations(frame: pd.DataFrame, max_chars: int) -> tuple[list[RowFailure], list[dict[str, Any]]]:
    """Validate ``frame``; returns row failures (by frame index) and a per-expectation summary."""
    import great_expectations as gx
    from great_expectations.data_context.types import base as gx_base

    # GX pins this module's logger at INFO and announces a temporary folder for every
    # ephemeral context; that is noise in a pipeline's output
    logging.getLogger(gx_base.__name__).setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = gx_base.ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("alignflow").add_dataframe_asset("records")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(
        build_suite(max_chars),
        result_format={"result_format": "COMPLETE", "return_unexpected_index_query": False},
    )
    failures, summary = [], []
    for item in result.results:
        config = item.expectation_config
        column = config.kwargs.get("column")
        indices = list(item.result.get("unexpected_index_list") or [])
        summary.append(
            {
                "expectation": config.type,
                "column": column,
                "success": bool(item.success),
                "unexpected": int(item.result.get("unexpected_count") or 0),
            }
        )
        for index in indices:
            failures.append(
                RowFailure(
                    int(index),
                    _reason(config.type, column),
                    column,
                    _message(config.type, column, config.kwargs, frame, int(index)),
                )
            )
    return failures, summary
