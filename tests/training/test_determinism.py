"""Deterministic kernels per stage: on by default on a CPU, off by default on a GPU, strict
where a stage asks, and every stage run says which mode it trained in."""

from __future__ import annotations

import os

import pytest
import torch

from alignflow.errors import InputError
from alignflow.training.determinism import (
    DETERMINISM_TAG,
    OFF,
    STRICT,
    WARN_ONLY,
    refusing_nondeterminism,
    resume_caveat,
    use_determinism,
)


@pytest.fixture(autouse=True)
def _torch_settings_restored(monkeypatch):
    """Each test leaves torch's process-wide settings as it found them."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]


def _mode() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def test_on_a_cpu_the_default_is_on_and_warns_where_a_kernel_has_no_deterministic_variant():
    assert use_determinism(None) == WARN_ONLY
    assert _mode() == (True, True)
    with pytest.warns(UserWarning, match="put_ does not have a deterministic implementation"):
        torch.zeros(4).put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))


def test_asked_for_it_is_strict_and_the_stage_stops_naming_the_operation():
    assert use_determinism(True) == STRICT
    assert _mode() == (True, False)
    refused = r"put_ has no deterministic kernel.*deterministic: true"
    with pytest.raises(InputError, match=refused) as stopped, refusing_nondeterminism():
        torch.zeros(4).put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))
    assert isinstance(stopped.value.__cause__, RuntimeError)


def test_other_runtime_errors_pass_through_unchanged():
    use_determinism(True)
    with pytest.raises(RuntimeError, match="shape") as stopped, refusing_nondeterminism():
        torch.zeros(2, 3) @ torch.zeros(2, 3)
    assert not isinstance(stopped.value, InputError)


def test_off_when_asked():
    assert use_determinism(False) == OFF
    assert _mode()[0] is False
    torch.zeros(4).put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))  # no warning, no error


def test_on_a_gpu_the_default_is_off_and_asking_fixes_cublas_workspace(monkeypatch):
    # isolates the choice from the hardware: this machine's torch has no CUDA to switch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert use_determinism(None) == OFF
    assert _mode()[0] is False and torch.backends.cudnn.deterministic is False
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert use_determinism(True) == STRICT
    assert torch.backends.cudnn.deterministic is True and torch.backends.cudnn.benchmark is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_dpo_stage_trains_strictly_deterministic_on_a_cpu_and_repeats_itself_exactly(
    demo_config, demo_snapshot, sft_result, tmp_path, stage_tags
):
    """Every kernel of the CPU path (label head, packed rows, CPU attention, fused norms, the
    reference pass) has a deterministic variant: strict mode runs to the end, twice alike."""
    from alignflow.training.dpo import run_dpo

    short = ("dpo.max_steps=4", "dpo.save_steps=100", "dpo.eval_max_rows=16")
    config = demo_config(*short, "dpo.deterministic=true")
    first = run_dpo(config, demo_snapshot, tmp_path / "first", sft_result.model_dir)
    assert stage_tags[DETERMINISM_TAG] == STRICT
    second = run_dpo(config, demo_snapshot, tmp_path / "second", sft_result.model_dir)
    assert first.metrics["global_step"] == 4
    assert first.metrics["train_loss"] == second.metrics["train_loss"]
    assert first.metrics["eval/loss"] == second.metrics["eval/loss"]

    run_dpo(
        demo_config("dpo.max_steps=1", "dpo.save_steps=100", "dpo.eval_max_rows=8"),
        demo_snapshot,
        tmp_path / "default",
        sft_result.model_dir,
    )
    assert stage_tags[DETERMINISM_TAG] == WARN_ONLY


def _refused_op(*args, **kwargs):
    """A toy stage's run that meets an operation without a deterministic kernel."""
    torch.zeros(4).put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))


def test_a_stage_run_through_the_registry_reports_a_refused_operation_as_an_input_error():
    from alignflow.training.registry import StageSpec, register_stage, stage_spec, unregister_stage

    register_stage(StageSpec("toy_strict", _refused_op, "alignflow.training.sft_config:SFTConfig"))
    try:
        use_determinism(True)
        with pytest.raises(InputError, match="put_ has no deterministic kernel"):
            stage_spec("toy_strict").load_runner()(None, "data", "out")
    finally:
        unregister_stage("toy_strict")


def test_a_resume_says_it_is_not_bit_for_bit_when_deterministic_kernels_were_off():
    use_determinism(False)
    caveat = resume_caveat()
    assert caveat and "deterministic kernels were off" in caveat
    use_determinism(True)
    assert resume_caveat() is None
