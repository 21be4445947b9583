"""``torch_compile`` compiles a stage's decoder layers one by one (accelerate's regional
compilation, dynamic shapes), refuses a CPU without a C++ compiler, and reports what ran."""

from __future__ import annotations

import math

import pytest
import torch
from accelerate.utils import TorchDynamoPlugin
from safetensors.torch import load_file

from alignflow.errors import InputError
from alignflow.training import compilation


def test_an_inductor_plugin_is_set_to_compile_layer_by_layer_with_dynamic_shapes():
    plugin = TorchDynamoPlugin(backend="inductor")
    assert not plugin.use_regional_compilation
    args = compilation.compile_layer_by_layer({"dynamo_plugin": plugin, "cpu": True})
    assert args["dynamo_plugin"] is plugin and args["cpu"] is True
    assert plugin.use_regional_compilation and plugin.dynamic is True


def test_without_torch_compile_the_plugin_stays_off():
    plugin = TorchDynamoPlugin(backend="no")
    compilation.compile_layer_by_layer({"dynamo_plugin": plugin})
    assert not plugin.use_regional_compilation and plugin.dynamic is None
    assert compilation.compile_layer_by_layer({}) == {}


def test_compiled_modules_counts_what_runs_compiled():
    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
    assert compilation.compiled_modules(layers) == 0
    layers[1] = torch.compile(layers[1])
    assert compilation.compiled_modules(layers) == 1


def test_a_cpu_without_a_cpp_compiler_is_refused_before_any_step(monkeypatch):
    monkeypatch.setattr(compilation.shutil, "which", lambda name: None)
    with pytest.raises(InputError, match=r"C\+\+ compiler.*torch_compile: false"):
        compilation.require_cpu_compiler(use_cpu=True)
    compilation.require_cpu_compiler(use_cpu=False)  # a GPU run: inductor's CUDA kernels need none


def test_a_compiled_dpo_stage_trains_every_layer_compiled_and_saves_plain_weights(
    demo_config, demo_snapshot, sft_result, tmp_path, stage_tags
):
    from alignflow.training.dpo import run_dpo

    config = demo_config(
        "dpo.max_steps=3",
        "dpo.save_steps=1000",
        "dpo.eval_max_rows=8",
        "dpo.torch_compile=true",
        f"dpo.reference_cache_dir={tmp_path / 'cache'}",
    )
    result = run_dpo(config, demo_snapshot, tmp_path / "out", model_path=sft_result.model_dir)
    assert result.metrics["global_step"] == 3 and math.isfinite(result.metrics["train_loss"])
    # the compiled copy trains while the trainer's own model stayed in eval mode after the
    # reference pass: TRL then filed every step as evaluation and counted no tokens trained
    assert result.cost["cost/tokens_trained"] > 0 and result.cost["cost/mfu"] > 0, result.cost
    # and back in eval mode for the held-out pass: TRL filed it under train otherwise, losing the
    # held-out preference figures and counting the held-out pairs' tokens as trained
    assert "eval/rewards/accuracies" in result.metrics, sorted(result.metrics)
    layers = _decoder_layers(result.model_dir)
    # every decoder layer, and the parts outside them compiled whole (embedding, final norm, head)
    assert int(stage_tags["compute.compiled_modules"]) > layers > 1
    weights = load_file(next(iter(sorted(_safetensors(result.model_dir)))))
    assert weights and not any("_orig_mod" in key for key in weights)  # loadable by any transformers


def _decoder_layers(model_dir: str) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_dir).num_hidden_layers)


def _safetensors(model_dir: str):
    from pathlib import Path

    return Path(model_dir).glob("*.safetensors")
