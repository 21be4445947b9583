"""Loading a folder as the kind of model asked for: the wrong kind or broken files are refused
with the folder named, never loaded with a freshly initialised head."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from alignflow.models import load_causal_lm
from alignflow.models.loading import ModelLoadError
from alignflow.models.reward_scorer import REWARD_META, load_reward_scorer


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_the_right_kinds_load(tiny_model_dir, reward_model_dir):
    model, _ = load_causal_lm(tiny_model_dir)
    scorer = load_reward_scorer(reward_model_dir)
    assert model.config.architectures == ["LlamaForCausalLM"]
    assert len(scorer(["a prompt"], ["an answer"])) == 1


def test_a_policy_is_not_a_reward_model(tiny_model_dir):
    with pytest.raises(ModelLoadError, match="not a reward model") as caught:
        load_reward_scorer(tiny_model_dir)
    message = str(caught.value)
    assert str(tiny_model_dir) in message and "score.weight" in message and "LlamaForCausalLM" in message


def test_a_reward_model_is_not_a_causal_lm(reward_model_dir):
    """The tiny Llama ties its LM head to the embeddings, so only config.json can tell."""
    with pytest.raises(ModelLoadError, match="not a causal LM") as caught:
        load_causal_lm(reward_model_dir)
    assert str(reward_model_dir) in str(caught.value)
    assert "LlamaForSequenceClassification" in str(caught.value)


def test_weights_the_folder_lacks_are_refused_even_without_an_architecture_name(tmp_path):
    """A BERT-style classifier has no LM head to tie: loading it as a causal LM would invent one."""
    from alignflow.models import minilm_path

    folder = tmp_path / "encoder-classifier"
    AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("architectures")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="not a causal LM: BertLMHeadModel would start") as caught:
        load_causal_lm(folder)
    assert "cls.predictions" in str(caught.value)


def test_broken_weights_are_named(reward_model_dir, tmp_path):
    broken = _copy(reward_model_dir, tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="cannot load as a reward model") as caught:
        load_reward_scorer(broken)
    assert str(broken) in str(caught.value)


def test_outputs_must_match_the_objectives(tiny_model_dir, tmp_path):
    two = tmp_path / "two-outputs"
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    with torch.no_grad():
        model.score.weight.normal_()  # a trained-looking head: every weight saved
    model.save_pretrained(two)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(two)
    with pytest.raises(ModelLoadError, match="2 outputs but the reward model combines 1 objective") as caught:
        load_reward_scorer(two)
    hint = '{"objectives": ["LABEL_0", "LABEL_1"], "weights": [-1.0, 1.0]}'
    assert f"write {REWARD_META} giving each output a weight, e.g. {hint}" in str(caught.value)
    prompts, answers = ["p", "q"], ["an answer", "another"]

    def rewards(weights):
        (two / REWARD_META).write_text(json.dumps({"objectives": ["LABEL_0", "LABEL_1"], "weights": weights}))
        return torch.tensor(load_reward_scorer(two, normalize=False)(prompts, answers))

    (two / REWARD_META).write_text(hint)  # the hint, followed: class 1's logit less class 0's
    followed = torch.tensor(load_reward_scorer(two, normalize=False)(prompts, answers))
    torch.testing.assert_close(followed, rewards([0.0, 1.0]) - rewards([1.0, 0.0]))


def test_a_broken_reward_description_is_named(reward_model_dir, tmp_path):
    broken = _copy(reward_model_dir, tmp_path / "meta")
    for text in ("{not json", json.dumps({"pooling": "answer", "temperature": 2})):
        (broken / REWARD_META).write_text(text)
        with pytest.raises(ModelLoadError, match=REWARD_META):
            load_reward_scorer(broken)


def test_a_diverged_checkpoint_is_refused(tiny_model_dir, reward_model_dir, tmp_path):
    """NaN weights load fine, then score NaN (reward) or crash mid-generation (policy)."""
    from transformers import AutoModelForCausalLM

    policy = _copy(tiny_model_dir, tmp_path / "policy")
    model = AutoModelForCausalLM.from_pretrained(policy)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(policy)
    with pytest.raises(ModelLoadError, match="NaN or infinite weights in 1 tensors") as caught:
        load_causal_lm(policy)
    assert "layers.0.mlp.up_proj.weight" in str(caught.value) and str(policy) in str(caught.value)

    reward = _copy(reward_model_dir, tmp_path / "reward")
    model = AutoModelForSequenceClassification.from_pretrained(reward)
    with torch.no_grad():
        model.score.weight[0, 0] = float("inf")
    model.save_pretrained(reward)
    with pytest.raises(ModelLoadError, match=r"NaN or infinite weights in 1 tensors \(score.weight\)"):
        load_reward_scorer(reward)


TOKENIZER_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
)


def test_a_folder_without_its_tokenizer_is_refused(tiny_model_dir, reward_model_dir, tmp_path):
    """transformers builds an empty tokenizer from config.json alone: every text would read as
    a few unknown tokens, and every response would get the same score."""
    for source, load in ((reward_model_dir, load_reward_scorer), (tiny_model_dir, load_causal_lm)):
        bare = _copy(source, tmp_path / f"bare-{source.name}")
        for name in TOKENIZER_NAMES:
            (bare / name).unlink(missing_ok=True)
        with pytest.raises(ModelLoadError, match="no tokenizer in the folder") as caught:
            load(bare)
        assert str(bare) in str(caught.value)


def test_a_tokenizer_larger_than_the_embedding_table_is_refused(reward_model_dir, tmp_path):
    """Another model's tokenizer would produce ids past the table and crash mid-evaluation."""
    from alignflow.models import minilm_path

    swapped = _copy(reward_model_dir, tmp_path / "swapped")
    for name in TOKENIZER_NAMES:
        (swapped / name).unlink(missing_ok=True)
    AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(swapped)  # 30522 tokens
    with pytest.raises(ModelLoadError, match=r"tokenizer has 30522 tokens but the model embeds only \d+"):
        load_reward_scorer(swapped)
