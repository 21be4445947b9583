"""The TRL bench's table says which dtype each run trained in, from the runs, not the config,
and prices each stage's loop at the model FLOPs it does."""

from __future__ import annotations

import pytest

from bench.real_model_trl_bench import _markdown, mfu, trained_dtypes


def _case(dtypes: list[str], loss: float | None = None) -> dict:
    runs = [{"dtype": d, "rows_per_s": 1.0 + i, "held_out_loss": loss} for i, d in enumerate(dtypes)]
    case = {"steps": 4, "rows_per_s": 1.5, "tokens_per_s": 100.0, "call_rows_per_s": 1.0, "mfu": 0.3}
    case |= {"mfu_training": 0.2, "mfu_computed": 0.1, "tokens_computed_share": 0.5}
    case |= {"peak_rss_mb": 1000.0, "runs": runs}
    if loss is None:
        return case | {"held_out_reward": 0.2, "mean_reward": 0.1}
    return case | {"held_out_loss": loss}


def _result(ours_dpo: list[str]) -> dict:
    bf16 = ["bfloat16"] * len(ours_dpo)
    cases = {
        "dpo:alignflow": _case(ours_dpo, 0.70),
        "dpo:trl": _case(bf16, 0.71),
        "grpo:alignflow": _case(bf16),
        "grpo:trl": _case(bf16),
    }
    return {
        "machine": "x86_64", "cpu": "a CPU", "threads": 2, "dtype": "bfloat16", "peak_gflops": 900.0,
        "peak_gflops_measured": {"before": 890.0, "after": 900.0}, "parameters": 134_515_008,
        "repeats": len(ours_dpo), "cases": cases, "ratios": {}, "warm_up_s": 5.0,
        "load_average_1min_at_end": 1.0, "wall_s": 100.0,
    }  # fmt: skip


def test_a_run_that_trained_in_another_dtype_is_named_in_the_header():
    result = _result(["bfloat16", "float32", "bfloat16"])
    assert trained_dtypes(result)["dpo:alignflow"] == ["bfloat16", "float32", "bfloat16"]
    header = _markdown(result).splitlines()[2]
    assert "dpo:alignflow: bfloat16, float32, bfloat16" in header
    assert "every run" not in header and "grpo" not in header


def test_the_header_names_the_code_that_ran():
    assert "Code: 1a2b3c4+uncommitted." in _markdown(
        _result(["bfloat16"]) | {"code_commit": "1a2b3c4+uncommitted"}
    )
    assert "Code: not recorded." in _markdown(_result(["bfloat16"])), (
        "a result kept from before it was recorded"
    )


def test_runs_all_in_the_peak_s_dtype_say_so():
    header = _markdown(_result(["bfloat16"] * 3)).splitlines()[2]
    assert "bfloat16 weights + LoRA r16 on every linear layer, both sides, every run" in header


def test_grpo_mfu_counts_sampling_each_token_as_a_forward_pass():
    # 1e8 parameters, 100 tokens/s, a 100 GFLOP/s peak: training 4 N = 40%, sampling 2 N more
    grpo = mfu("grpo:alignflow", 100.0, 100_000_000, 100.0)
    assert grpo == pytest.approx({"all": 0.6, "training": 0.4, "computed": 0.4})


def test_dpo_mfu_is_its_training_pass_alone():
    assert mfu("dpo:trl", 100.0, 100_000_000, 100.0) == pytest.approx(
        {"all": 0.4, "training": 0.4, "computed": 0.4}
    )


def test_a_shared_prefix_computed_once_is_not_counted_as_work_done():
    # 60% of the real tokens computed (the rest a prompt shared by the rows after its first)
    assert mfu("dpo:alignflow", 100.0, 100_000_000, 100.0, computed_share=0.6)["computed"] == pytest.approx(
        0.24
    )


def test_the_table_shows_both_mfu_figures():
    table = _markdown(_result(["bfloat16"]))
    assert "| MFU (all model FLOPs) | MFU (training FLOPs only) | MFU (training, tokens computed) |" in table
    assert "| 30.0% | 20.0% | 10.0% |" in table.split("| grpo:alignflow |")[1].splitlines()[0]
    assert "(share median 0.50 DPO, 0.50 GRPO" in " ".join(table.split())
