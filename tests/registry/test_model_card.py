"""A version's model card states what the store recorded, and no more.

The demo champion's card, checked against its evaluation run, is in
``test_policy_serving.py``; here, a version nothing evaluated, and the figures' table.
"""

from __future__ import annotations

from pathlib import Path

import mlflow

from alignflow.registry import promotion
from alignflow.registry.model_card import CARD_FILE, figure_rows, point_figures


def test_a_version_with_no_evaluation_says_so_instead_of_showing_figures(registry):
    uri, logged = registry
    promotion.promote_by_hand(uri, logged.name, logged.version)
    card = Path(mlflow.artifacts.download_artifacts(f"models:/{logged.name}/{logged.version}/{CARD_FILE}"))
    text = card.read_text()
    assert "No evaluation is recorded for this version" in text
    assert "| figure |" not in text and "Without an interval" not in text
    assert "data_version: d1" in text and "**promoted**: Promoted to champion by hand" in text
    assert "No training stage run is recorded" in text and "license: other" in text


def test_figures_keep_their_interval_and_n_and_the_rest_are_listed_as_points():
    metrics = {
        "golden/task_accuracy": 0.5,
        "golden/task_accuracy/low": 0.25,
        "golden/task_accuracy/high": 0.75,
        "golden/task_accuracy/n": 16.0,
        "eval/kl_to_reference": 0.08,
    }
    assert figure_rows(metrics) == ["| `golden/task_accuracy` | 0.5 | [0.25, 0.75] | 16 |"]
    assert point_figures(metrics) == ["`eval/kl_to_reference` 0.08"]
