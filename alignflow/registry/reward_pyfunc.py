"""A reward model as an MLflow pyfunc that scores the way alignflow scores.

MLflow's transformers flavour would serve a reward model as a text-classification pipeline:
the [CLS] head with a sigmoid, blind to the pooling, prompt format and normalisation the
reward stage saved beside the weights. Registered reward models are therefore logged as a
:class:`RewardModel` pyfunc around the saved directory, so ``mlflow.pyfunc.load_model`` and
``mlflow models serve`` return the same rewards as :class:`~alignflow.models.reward_scorer.RewardScorer`.

Input: a DataFrame with ``prompt`` and ``response`` text columns (a prompt or response that
is a JSON list of ``{role, content}`` messages is read as a conversation). Output: a
DataFrame with one ``reward`` column (the signature makes MLflow reject input that lacks a
column, naming it). Param ``normalize`` (default true) applies the saved
mean/std; false gives the raw head output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

import alignflow

ARTIFACT = "reward_model"  # the saved model directory, under the logged model's artifacts/
INPUT_COLUMNS = ("prompt", "response")
SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", column) for column in INPUT_COLUMNS]),
    outputs=Schema([ColSpec("double", "reward")]),
    params=ParamSchema([ParamSpec("normalize", "boolean", True)]),
)


def as_conversation(text: Any) -> Any:
    """A cell holding a JSON list of chat messages becomes that list; anything else stays."""
    if isinstance(text, str) and text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text
        if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
            return value
    return text


class RewardModel(PythonModel):
    """``predict(DataFrame[prompt, response]) -> DataFrame[reward]`` over a saved reward model."""

    def load_context(self, context: Any) -> None:
        from alignflow.models.reward_scorer import load_reward_scorer

        self.scorer = load_reward_scorer(context.artifacts[ARTIFACT])

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        prompts = [as_conversation(p) for p in model_input["prompt"]]
        responses = [as_conversation(r) for r in model_input["response"]]
        normalize = bool((params or {}).get("normalize", True))
        rewards = self.scorer(prompts, responses) if normalize else self.scorer.raw(prompts, responses)
        return pd.DataFrame({"reward": rewards}, index=model_input.index)


def log_reward_model(
    model_dir: Path, name: str, metadata: dict[str, Any], pip_requirements: list[str]
) -> Any:
    """Log ``model_dir`` as a :class:`RewardModel` pyfunc to the active run; returns MLflow's info.

    alignflow's own package travels as ``code_paths`` so that a serving process without
    alignflow installed still loads the scorer the model was trained with.
    """
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=RewardModel(),
        artifacts={ARTIFACT: str(model_dir)},
        code_paths=[str(Path(alignflow.__file__).parent)],
        signature=SIGNATURE,
        pip_requirements=pip_requirements,
        metadata=metadata,
    )
