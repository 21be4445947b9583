"""A registered policy loaded with ``mlflow.pyfunc`` answers as the evaluation generates.

The transformers flavour it replaced echoed the prompt, skipped the chat template and had
no params: a served policy then answered differently from the one promotion judged.
"""

from __future__ import annotations

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from alignflow.errors import InputError
from alignflow.evaluation.config import EvaluationConfig
from alignflow.models.factory import load_causal_lm
from alignflow.models.prompting import format_prompt, generate
from alignflow.registry import models

PROMPTS = ["What is 2 plus 3?", "Compute 4 + 4.", "Add 1 and 6."]


def _log(tmp_path, model_dir, evaluation=None, name="demo-policy"):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        models.log_model(model_dir, uri, name, evaluation=evaluation)
    return mlflow.pyfunc.load_model(f"models:/{name}@{models.CHALLENGER}")


def evaluation_answers(model_dir, prompts, max_new_tokens=16):
    """What the evaluation's generation gives (greedy, the chat template applied)."""
    model, tokenizer = load_causal_lm(model_dir, merge_lora=True)
    return generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    return _log(tmp_path_factory.mktemp("policy-pyfunc"), tiny_model_dir)


def test_prompts_get_the_evaluations_completions_without_the_prompt(served, tiny_model_dir):
    expected = evaluation_answers(tiny_model_dir, PROMPTS)
    assert served.predict(PROMPTS) == expected
    assert served.predict(pd.DataFrame({"prompt": PROMPTS})) == expected
    assert served.predict(PROMPTS[0]) == expected[:1]
    assert all(not answer.startswith(prompt) for answer, prompt in zip(expected, PROMPTS, strict=True))


def test_a_chat_body_gets_a_chat_completion_through_the_chat_template(served, tiny_model_dir):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[0]}]
    reply = served.predict({"messages": messages})
    assert reply["object"] == "chat.completion"
    content = reply["choices"][0]["message"]["content"]
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert content == evaluation_answers(tiny_model_dir, [messages])[0]
    _, tokenizer = load_causal_lm(tiny_model_dir)
    assert tokenizer.chat_template and "Be brief." in format_prompt(tokenizer, messages), "a template"
    completions = served.predict({"prompt": PROMPTS[:2]})
    assert completions["object"] == "text_completion"
    assert [c["text"] for c in completions["choices"]] == evaluation_answers(tiny_model_dir, PROMPTS[:2])


def test_params_default_to_the_evaluations_decoding_and_are_honoured(tmp_path, served, tiny_model_dir):
    params = {p.name: p.default for p in served.metadata.get_params_schema().params}
    default = EvaluationConfig()
    assert params == {
        "max_new_tokens": default.max_new_tokens,
        "temperature": default.temperature,
        "top_p": 1.0,
        "do_sample": False,
    }
    short = served.predict(PROMPTS, params={"max_new_tokens": 2})
    assert short == evaluation_answers(tiny_model_dir, PROMPTS, max_new_tokens=2)
    capped = served.predict({"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 2})
    assert capped["choices"][0]["message"]["content"] == short[0]
    configured = _log(tmp_path / "other", tiny_model_dir, EvaluationConfig(max_new_tokens=3), "p2")
    assert {p.name: p.default for p in configured.metadata.get_params_schema().params}["max_new_tokens"] == 3
    assert configured.predict(PROMPTS) == evaluation_answers(tiny_model_dir, PROMPTS, max_new_tokens=3)


def test_an_unreadable_request_names_what_it_accepts(served):
    with pytest.raises(InputError, match="messages"):
        served.predict(pd.DataFrame({"text": PROMPTS}))
    with pytest.raises(InputError, match="prompt"):
        served.predict([{"role": "user"}])


@pytest.fixture
def lora_policy(tmp_path, tiny_model_dir):
    """A LoRA adapter on the tiny model, its B matrices non-zero so that it changes answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapted = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():
        for name, weight in adapted.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.5)
    out = tmp_path / "lora-policy"
    adapted.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_a_lora_adapter_serves_on_its_base_as_the_evaluation_loads_it(tmp_path, lora_policy, tiny_model_dir):
    served = _log(tmp_path, lora_policy)
    expected = evaluation_answers(lora_policy, PROMPTS)
    assert expected != evaluation_answers(tiny_model_dir, PROMPTS), "the adapter changes the answers"
    assert served.predict(PROMPTS) == expected
    version = MlflowClient(mlflow.get_tracking_uri()).get_model_version("demo-policy", "1")
    assert version.tags[models.BASE_MODEL_TAG] == str(tiny_model_dir)
