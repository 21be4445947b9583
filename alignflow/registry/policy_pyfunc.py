"""A policy as an MLflow pyfunc that answers the way alignflow's evaluation made it answer.

MLflow's transformers flavour serves a policy as a text-generation pipeline: it echoes the
prompt, never applies the chat template, refuses OpenAI chat bodies and has no params. The
completions a user gets from the registry would then not be the ones promotion was decided
on. Registered policies are therefore logged as a :class:`PolicyModel` pyfunc around the
saved directory: it loads the model as evaluation loads it
(:func:`~alignflow.models.factory.load_causal_lm`, LoRA folded in, the run's dtype) and
generates with evaluation's own :func:`~alignflow.models.prompting.generate` (chat template,
left padding, completion only), with the evaluation's decoding settings as param defaults.

Inputs (``mlflow.pyfunc.load_model(...).predict`` and ``mlflow models serve`` alike):

- an OpenAI chat body ``{"messages": [{"role", "content"}, ...]}`` -> a ``chat.completion``
  dict (``choices[0].message.content``); a ``max_tokens`` in the body is honoured;
- an OpenAI completions body ``{"prompt": str | [str, ...]}`` -> a ``text_completion`` dict;
- a string, a list of strings (or of message lists), a DataFrame with a ``prompt`` (or
  ``messages``) column -> a list of completion strings, in order.

The signature carries params only (``max_new_tokens``, ``temperature``, ``top_p``,
``do_sample``): a named input schema makes MLflow drop a bare list of strings before the
model sees it, so the input shapes above are checked here instead, with an error naming them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import ParamSchema, ParamSpec

import alignflow
from alignflow.errors import InputError
from alignflow.evaluation.config import EvaluationConfig
from alignflow.models.prompting import Prompt
from alignflow.registry.reward_pyfunc import as_conversation

ARTIFACT = "policy_model"  # the saved model directory, under the logged model's artifacts/
ACCEPTED = (
    'a chat body {"messages": [...]}, a completions body {"prompt": ...}, a string, a list of '
    "strings or message lists, or a DataFrame with a `prompt` or `messages` column"
)


def evaluation_decoding(evaluation: EvaluationConfig, model_dir: Path) -> dict[str, Any]:
    """How the evaluation decoded: its ``max_new_tokens``, greedy unless it sampled, its
    temperature, and the ``top_p`` it sampled with (the model's generation config, else 1.0)."""
    saved = json.loads(text) if (text := _read(model_dir / "generation_config.json")) else {}
    return {**evaluation.decoding(), "top_p": float(saved.get("top_p") or 1.0)}


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


PARAM_TYPES = {"max_new_tokens": "long", "temperature": "double", "top_p": "double", "do_sample": "boolean"}


def signature(defaults: Mapping[str, Any]) -> ModelSignature:
    """Params only, defaulting to the evaluation's decoding (see the module's docstring for why
    no input schema)."""
    params = [ParamSpec(name, kind, defaults[name]) for name, kind in PARAM_TYPES.items()]
    return ModelSignature(inputs=None, outputs=None, params=ParamSchema(params))


def _message_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, Mapping) and "content" in m for m in value)


def _prompt(value: Any) -> Prompt:
    """One prompt: text, a message list, or a cell holding either (JSON text of messages too)."""
    value = as_conversation(value.tolist() if isinstance(value, np.ndarray) else value)
    if isinstance(value, str):
        return value
    if _message_list(value):
        return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in value]
    raise InputError(
        f"a prompt must be text or a list of {{role, content}} messages, got {value!r:.80}; send {ACCEPTED}"
    )


def _column(frame: pd.DataFrame) -> list[Prompt]:
    for column in ("messages", "prompt"):
        if column in frame.columns:
            return [_prompt(value) for value in frame[column]]
    raise InputError(f"no `prompt` or `messages` column in {list(frame.columns)}; send {ACCEPTED}")


def read_request(model_input: Any) -> tuple[list[Prompt], str]:
    """The prompts in a request and the reply it asks for: ``chat``, ``text_completion`` or
    ``list`` (a list of completion strings)."""
    if isinstance(model_input, Mapping) and "messages" in model_input:
        return [_prompt(model_input["messages"])], "chat"
    if isinstance(model_input, Mapping) and "prompt" in model_input:
        texts = model_input["prompt"]
        texts = texts.tolist() if isinstance(texts, np.ndarray) else texts
        return [_prompt(t) for t in ([texts] if isinstance(texts, str) else texts)], "text_completion"
    if isinstance(model_input, pd.DataFrame):
        return _column(model_input), "list"
    if isinstance(model_input, str):
        return [model_input], "list"
    if isinstance(model_input, (list, tuple, np.ndarray, pd.Series)) and len(model_input):
        if _message_list(list(model_input)):  # one conversation, not a list of prompts
            return [_prompt(list(model_input))], "list"
        return [_prompt(item) for item in model_input], "list"
    raise InputError(f"cannot read a {type(model_input).__name__} as prompts; send {ACCEPTED}")


def decoding(params: Mapping[str, Any] | None, body: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``generate``'s decoding arguments: the params over the logged defaults (MLflow fills them
    in too), and an OpenAI body's ``max_tokens`` over ``max_new_tokens``."""
    given = {**defaults, **(params or {})}
    if isinstance(body, Mapping) and body.get("max_tokens") is not None:
        given["max_new_tokens"] = body["max_tokens"]
    return {
        "max_new_tokens": int(given["max_new_tokens"]),
        "temperature": float(given["temperature"]),
        "top_p": float(given["top_p"]),
        "do_sample": bool(given["do_sample"]),
    }


def finish_reason(tokenizer: Any, text: str, max_new_tokens: int) -> str:
    """``length`` when the completion used its whole token budget (as its text re-reads), else ``stop``."""
    used = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return "length" if used >= max_new_tokens else "stop"


def chat_completion(text: str, model: str, reason: str) -> dict[str, Any]:
    """A completion as OpenAI's chat API returns it."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}],
    }


def text_completion(texts: Sequence[str], model: str, reasons: Sequence[str]) -> dict[str, Any]:
    """Completions as OpenAI's completions API returns them, one choice per prompt."""
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": text, "finish_reason": reason}
            for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ],
    }


class PolicyModel(PythonModel):
    """Completions of a saved policy, generated as alignflow's evaluation generates them."""

    def load_context(self, context: Any) -> None:
        import torch

        from alignflow.models.factory import load_causal_lm

        config = context.model_config or {}
        dtype = getattr(torch, config["dtype"]) if config.get("dtype") else None
        self.model, self.tokenizer = load_causal_lm(context.artifacts[ARTIFACT], dtype, merge_lora=True)
        self.defaults = config.get("decoding") or evaluation_decoding(EvaluationConfig(), Path())
        self.batch_size = int(config.get("batch_size") or EvaluationConfig().batch_size)
        self.seed = config.get("seed")
        self.name = str(config.get("name") or "alignflow-policy")

    # MLflow reads this hint: pd.DataFrame passes every input through as sent (any other hint
    # becomes an input schema of its own); what arrives is any shape of the module's docstring
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        from alignflow.models.prompting import generate

        prompts, reply = read_request(model_input)
        settings = decoding(params, model_input, self.defaults)
        texts = generate(
            self.model, self.tokenizer, prompts, batch_size=self.batch_size, seed=self.seed, **settings
        )
        if reply == "list":
            return texts
        reasons = [finish_reason(self.tokenizer, t, settings["max_new_tokens"]) for t in texts]
        model = str(model_input.get("model") or self.name)
        if reply == "chat":
            return chat_completion(texts[0], model, reasons[0])
        return text_completion(texts, model, reasons)


def log_policy_model(
    model_dir: Path,
    name: str,
    metadata: dict[str, Any],
    pip_requirements: list[str],
    evaluation: EvaluationConfig | None = None,
    dtype: str | None = None,
    served_name: str | None = None,
) -> Any:
    """Log ``model_dir`` as a :class:`PolicyModel` pyfunc to the active run; returns MLflow's info.

    ``evaluation``: the run's evaluation settings, whose decoding becomes the params' defaults
    (the built-in defaults without one); ``dtype``: the one evaluation generated in (None keeps
    the saved one); ``served_name``: the ``model`` a chat reply names (the registered name).
    alignflow travels as ``code_paths``, as for the reward model.
    """
    evaluation = evaluation or EvaluationConfig()
    defaults = evaluation_decoding(evaluation, model_dir)
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=PolicyModel(),
        artifacts={ARTIFACT: str(model_dir)},
        code_paths=[str(Path(alignflow.__file__).parent)],
        signature=signature(defaults),
        pip_requirements=pip_requirements,
        metadata=metadata,
        model_config={
            "name": served_name or name,
            "dtype": dtype,
            "decoding": defaults,
            "batch_size": evaluation.batch_size,
            "seed": evaluation.seed,
        },
    )
