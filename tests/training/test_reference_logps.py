"""Reference log-probs computed once per (reference, tokenized pairs), and read back on reruns."""

from __future__ import annotations

import json

import pytest
import torch

from alignflow.training import reference_logps as refs


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory, demo_snapshot):
    from alignflow.data.snapshot import load_split
    from alignflow.models import build_tiny_model

    rows = load_split(demo_snapshot, "train")
    texts = [f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in rows]
    return build_tiny_model(texts, tmp_path_factory.mktemp("tiny") / "model")


def _dpo(demo_config, snapshot, policy, out, cache, *overrides):
    from alignflow.training.dpo import run_dpo

    config = demo_config(
        "dpo.max_steps=6",
        "dpo.save_steps=1000",
        "dpo.eval_max_rows=32",
        f"dpo.reference_cache_dir={cache}",
        *overrides,
    )
    return run_dpo(config, snapshot, out, model_path=policy)


def test_a_rerun_with_other_dpo_settings_reads_the_reference_from_the_cache(
    demo_config, demo_snapshot, tiny_policy, tmp_path
):
    cache = tmp_path / "cache"
    first = _dpo(demo_config, demo_snapshot, tiny_policy, tmp_path / "a", cache)
    assert first.metrics["reference/train_cached"] == 0.0
    assert first.metrics["reference/eval_cached"] == 0.0
    stored = sorted(cache.glob("*.safetensors"))
    assert len(stored) == 2  # train and eval pairs

    second = _dpo(demo_config, demo_snapshot, tiny_policy, tmp_path / "b", cache, "dpo.beta=0.5")
    assert second.metrics["reference/train_cached"] == 1.0
    assert second.metrics["reference/eval_cached"] == 1.0
    assert sorted(cache.glob("*.safetensors")) == stored

    # a different reference (here: other max_length, so other tokenized rows) gets its own entry
    third = _dpo(demo_config, demo_snapshot, tiny_policy, tmp_path / "c", cache, "dpo.max_length=12")
    assert third.metrics["reference/train_cached"] == 0.0
    assert len(list(cache.glob("*.safetensors"))) == 4


def test_cached_training_equals_training_against_the_live_reference(
    demo_config, demo_snapshot, tiny_policy, tmp_path
):
    cached = _dpo(demo_config, demo_snapshot, tiny_policy, tmp_path / "a", tmp_path / "cache")
    live = _dpo(
        demo_config,
        demo_snapshot,
        tiny_policy,
        tmp_path / "b",
        tmp_path / "cache",
        "dpo.precompute_reference=false",
    )
    assert "reference/train_cached" not in live.metrics
    assert cached.metrics["train_loss"] == pytest.approx(live.metrics["train_loss"], abs=1e-4)
    assert cached.metrics["eval/rewards/margins"] == pytest.approx(
        live.metrics["eval/rewards/margins"], abs=1e-4
    )


@pytest.mark.parametrize("lora", [False, True])
def test_length_sorted_log_probs_equal_trls_own_precompute(demo_snapshot, tiny_policy, tmp_path, lora):
    """The sorted, cached pass gives TRL's numbers for every row, in the dataset's order; with
    LoRA (a frozen head) it already scores with alignflow's label head, though TRL runs it
    inside its constructor, before the head would otherwise be installed."""
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from alignflow.data.pairing import load_pairs
    from alignflow.training.dpo import AlignflowDPOTrainer, pair_dataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    dataset = pair_dataset(load_pairs(demo_snapshot, "train")[:40], tokenizer)
    args = dict(
        output_dir=str(tmp_path / "o"),
        precompute_ref_log_probs=True,
        precompute_ref_batch_size=7,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    common = dict(train_dataset=dataset, processing_class=tokenizer)
    if lora:
        common["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    ours = AlignflowDPOTrainer(
        model=str(tiny_policy), args=DPOConfig(**args), reference_cache_dir=tmp_path / "cache", **common
    )
    # 40 rows in batches of 7: six forwards of the reference (nothing trained yet)
    assert ours.label_head_calls == (6 if lora else 0), "a trainable head keeps TRL's path"
    theirs = DPOTrainer(model=str(tiny_policy), args=DPOConfig(**args), **common)
    for column in ("ref_chosen_logps", "ref_rejected_logps"):
        assert torch.tensor(ours.train_dataset[column]) == pytest.approx(
            torch.tensor(theirs.train_dataset[column]), abs=1e-4
        )


def test_a_torn_cache_file_is_recomputed_not_trusted(tmp_path, caplog):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"not a safetensors file")
    assert refs.load_cached(path, 3) is None
    refs.store(path, torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]))
    assert refs.load_cached(path, 3) is None  # stored for 2 rows: not these 3
    chosen, rejected = refs.load_cached(path, 2)
    assert chosen.tolist() == [1.0, 2.0] and rejected.tolist() == [0.0, 1.0]
    assert "unreadable" in caplog.text and "does not match" in caplog.text


def test_the_key_changes_with_the_weights_the_rows_and_the_settings():
    from datasets import Dataset

    rows = Dataset.from_list([{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]}])
    other = Dataset.from_list([{"prompt_ids": [1, 2], "chosen_ids": [3, 4], "rejected_ids": [5]}])
    base = refs.cache_key("w", refs.rows_digest(rows), {"ld_alpha": None})
    assert refs.cache_key("w", refs.rows_digest(rows), {"ld_alpha": None}) == base
    assert refs.cache_key("w2", refs.rows_digest(rows), {"ld_alpha": None}) != base
    assert refs.cache_key("w", refs.rows_digest(other), {"ld_alpha": None}) != base
    assert refs.cache_key("w", refs.rows_digest(rows), {"ld_alpha": 0.5}) != base
    assert json.loads(json.dumps({"k": base}))["k"] == base


def test_cache_home_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path / "a"))
    assert refs.reference_cache_dir() == tmp_path / "a" / "reference-logps"
    monkeypatch.delenv("ALIGNFLOW_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert refs.reference_cache_dir() == tmp_path / "x" / "alignflow" / "reference-logps"
    assert refs.reference_cache_dir(tmp_path / "mine") == tmp_path / "mine"
