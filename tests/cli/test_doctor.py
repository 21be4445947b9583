import importlib.util
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.cli.doctor import (
    check_accelerate,
    check_dvc,
    check_mlflow,
    check_model,
    check_prefect,
    check_training,
)
from alignflow.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_a_workspace_of_its_own(tmp_path, monkeypatch):
    """doctor checks the working folder's DVC repository and writes there (DVC's ``.dvc/tmp``):
    each test runs in its own folder, not in the checkout."""
    monkeypatch.chdir(tmp_path)


def test_unreachable_services_are_reported_with_a_fix(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    [prefect] = check_prefect(load_config(None, []).orchestration)
    assert not prefect.ok and "did not answer" in prefect.detail and prefect.fix
    mlflow = check_mlflow("http://127.0.0.1:9")
    assert not mlflow.ok and "mlflow/README.md" in mlflow.fix


def test_doctor_exits_nonzero_when_a_service_is_missing(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # another test in this worker may have set it
    result = CliRunner().invoke(app, ["doctor", "--set", "tracking.uri=http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "MLflow" in result.output and "missing" in result.output
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output


def test_doctor_needs_no_activated_environment(monkeypatch):
    """A virtual environment's python run without activating it: no `dvc` command on PATH."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # another test in this worker may have set it
    kept = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "dvc").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(kept))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    # a remote's scheme is looked up in the library too: supported exactly when its plugin is there
    assert check_dvc("s3://bucket/data").ok == (importlib.util.find_spec("dvc_s3") is not None)


def test_work_pools_without_a_prefect_server_are_reported(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # another test in this worker may have set it
    config = load_config(None, ["orchestration.work_pools.sft=gpu", "orchestration.work_pools.reward=gpu"])
    [prefect] = check_prefect(config.orchestration)
    assert not prefect.ok
    assert "reward, sft" in prefect.detail and "PREFECT_API_URL" in prefect.fix


def test_database_tracking_store_is_probed(postgres_url):
    assert check_mlflow(postgres_url).ok
    closed = check_mlflow("postgresql+psycopg://postgres@127.0.0.1:9/test")
    assert not closed.ok and "refused" in closed.detail
    no_driver = check_mlflow("mysql://user@127.0.0.1/mlflow")
    assert not no_driver.ok and "MySQLdb" in no_driver.detail


def test_multi_process_settings_are_checked_against_the_machine(tmp_path):
    def orchestration(*overrides):
        return load_config(None, ["orchestration.num_processes=2", *overrides]).orchestration

    cpu_ddp = check_accelerate(orchestration(), gpu_count=0)
    assert cpu_ddp.ok and "gloo" in cpu_ddp.detail
    too_many = check_accelerate(orchestration(), gpu_count=1)
    assert not too_many.ok and "at most 1" in too_many.fix
    missing = check_accelerate(orchestration(f"orchestration.accelerate_config={tmp_path}/none.yaml"), 0)
    assert not missing.ok and "does not exist" in missing.detail
    fsdp = f"orchestration.accelerate_config={REPO}/configs/accelerate/fsdp.yaml"
    assert not check_accelerate(orchestration(fsdp), gpu_count=0).ok
    assert check_accelerate(orchestration(fsdp), gpu_count=2).ok


def test_qlora_needs_a_gpu():
    config = load_config(REPO / "configs" / "gpu-llama-8b-qlora.yaml", [])
    [qlora] = [c for c in check_training(config, gpu_count=0) if c.name == "QLoRA"]
    assert not qlora.ok and "GPU no" in qlora.detail
    assert check_training(load_config(None, []), gpu_count=0) == []


def test_hub_models_must_be_cached_when_the_hub_is_off(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    uncached = check_model("alignflow-tests/never-downloaded")
    assert not uncached.ok and "not in the local cache" in uncached.detail and "hf download" in uncached.fix
    assert check_model("tiny").ok and check_model(str(tmp_path)).ok
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert check_model("alignflow-tests/never-downloaded").ok


def test_a_real_model_is_ok_once_converted_and_otherwise_names_the_pull_command(monkeypatch, tmp_path):
    from alignflow.models import real_models

    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(real_models, "installed_gguf", lambda model: None)
    missing = check_model("smollm2-135m-instruct")
    assert not missing.ok and "not on this machine" in missing.detail, missing
    assert "alignflow model pull smollm2-135m-instruct" in missing.fix
    folder = real_models.real_model_dir("smollm2-135m-instruct")
    folder.mkdir(parents=True)
    (folder / real_models.PROVENANCE_FILE).write_text("{}")
    converted = check_model("smollm2-135m-instruct")
    assert converted.ok and str(folder) in converted.detail


def test_random_weights_need_only_a_config_and_say_where_it_comes_from(monkeypatch, tmp_path):
    from alignflow.cli.doctor import model_checks
    from alignflow.models import random_weights, real_models

    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(random_weights, "local_gguf", lambda model: None)
    random = ["model.name=smollm2-135m-instruct", "model.weights=random", "reward.backbone=minilm"]
    policy, backbone = model_checks(load_config(None, random))
    assert not policy.ok and "alignflow model pull smollm2-135m-instruct" in policy.fix, policy
    assert backbone.ok and "minilm: random weights" in backbone.detail, backbone
    copy = random_weights.config_only_dir("smollm2-135m-instruct")
    copy.mkdir(parents=True)
    (copy / "config.json").write_text("{}")
    (copy / "tokenizer.json").write_text("{}")
    (policy,) = model_checks(load_config(None, random[:2]))  # the reward model shares the policy's
    assert policy.ok and str(copy) in policy.detail, policy
    assert not real_models.is_converted(real_models.real_model_dir("smollm2-135m-instruct"))


def test_bf16_weights_on_a_cpu_without_bf16_units_are_flagged(monkeypatch):
    import torch

    config = load_config(None, ["model.dtype=bfloat16"])
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)
    (flagged,) = check_training(config, gpu_count=0)
    assert not flagged.ok and "emulated" in flagged.detail and "model.dtype=fastest" in flagged.fix
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    (fine,) = check_training(config, gpu_count=0)
    assert fine.ok and "AVX512-BF16" in fine.detail
    assert check_training(load_config(None, []), gpu_count=0) == [], "fp32 needs no check"


def test_fastest_dtype_says_what_it_resolves_to_on_this_cpu(monkeypatch):
    import torch

    config = load_config(None, ["model.dtype=fastest"])
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)
    (plain,) = check_training(config, gpu_count=0)
    assert plain.ok and "fp32" in plain.detail
    from alignflow.models import cpu_dtype

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(cpu_dtype, "cpu_gemm_rates", lambda: {"bfloat16": 2500.0, "float32": 300.0})
    from alignflow.models import fp32_gemm

    monkeypatch.setattr(fp32_gemm, "onednn_fp32_faster", lambda: False)
    (amx,) = check_training(config, gpu_count=0)
    assert amx.ok and "bf16 (AMX; GEMM bf16 2500 GFLOP/s, fp32 300 GFLOP/s on torch's BLAS)" in amx.detail
    monkeypatch.setattr(fp32_gemm, "onednn_fp32_faster", lambda: True)  # an AMD EPYC, say
    (amd,) = check_training(config, gpu_count=0)
    assert "fp32 300 GFLOP/s on oneDNN)" in amd.detail
    monkeypatch.setattr(cpu_dtype, "cpu_gemm_rates", lambda: {"bfloat16": 165.0, "float32": 315.0})
    (slow,) = check_training(config, gpu_count=0)
    assert slow.ok and "fp32 (AMX; GEMM bf16 165 GFLOP/s" in slow.detail
