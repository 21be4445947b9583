"""Suite-wide settings and shared fixtures.

Everything runs offline: no hub downloads, no analytics, models built from scratch on
the demo data. Fixtures that need a real service (PostgreSQL) skip on a user's machine
that lacks it, and fail under CI=true where the service must be there.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
# cached reference log-probs and the like stay out of the user's ~/.cache. Made once per session:
# xdist's controller imports this file before it starts the workers, which inherit the variable,
# so the whole session shares one cache (SmolLM2 is converted into it once, not per worker) and
# the process that made it removes it at exit (the converted model alone is 517 MB)
if "ALIGNFLOW_CACHE" not in os.environ:
    os.environ["ALIGNFLOW_CACHE"] = tempfile.mkdtemp(prefix="alignflow-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ALIGNFLOW_CACHE"], ignore_errors=True)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: one torch thread each, or their spinning
    # thread pools fight over the cores (set before anything imports torch)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]

# Test files that take minutes on two cores, longest first (per-file sums of a `--junitxml`
# report of `make test`). They start first, so the two workers end together instead of one waiting
# through the other's last long file; the Makefile turns off xdist's own reordering (most tests
# first), which put these one-test files last. A stale entry costs balance, never correctness.
LONG_FILES = (
    "tests/flows/test_adversarial_promotion.py",
    "tests/test_readme.py",
    "tests/training/test_hh_rlhf_reward.py",
    "tests/flows/test_feedback_launcher.py",
    "tests/flows/test_retrain.py",
)


def restore_tracking_uri(before: str | None) -> None:
    """MLflow's tracking URI back to ``before`` (``mlflow.set_tracking_uri`` also sets
    ``MLFLOW_TRACKING_URI``, which the CLI reads)."""
    if os.environ.get("MLFLOW_TRACKING_URI") == before:
        return
    if "mlflow" in sys.modules:
        sys.modules["mlflow"].set_tracking_uri(before)
    elif before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(autouse=True, scope="module")
def _tracking_uri_restored_after_module():
    """A module's fixtures that point MLflow at their own server leave it pointing there: a later
    module's ``data add`` in the same worker then asked that stopped server (MLflow's retries,
    ~4 min a call; now a one-line error)."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    restore_tracking_uri(before)


@pytest.fixture(autouse=True)
def _tracking_uri_restored_after_test():
    """The same for what a test itself points MLflow at."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    restore_tracking_uri(before)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FILES)}

    def order(item) -> int:
        try:
            return rank.get(Path(item.fspath).relative_to(REPO_ROOT).as_posix(), len(LONG_FILES))
        except ValueError:  # a test outside the repository keeps its place after these
            return len(LONG_FILES)

    items.sort(key=order)


def shared_data_dir() -> Path:
    """``$ALIGNFLOW_SHARED_DATA``, else ``../shared/data`` beside this checkout, else beside the
    local checkout it was cloned from (a clone made elsewhere, e.g. under /tmp, finds it too)."""
    if os.environ.get("ALIGNFLOW_SHARED_DATA"):
        return Path(os.environ["ALIGNFLOW_SHARED_DATA"])
    beside = REPO_ROOT.parent / "shared" / "data"
    if beside.exists():
        return beside
    import subprocess

    origin = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "config", "--get", "remote.origin.url"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    source = (
        Path(origin.removeprefix("file://"))
        if origin and "://" not in origin.replace("file://", "")
        else None
    )
    if source is not None and source.is_dir() and (source.parent / "shared" / "data").exists():
        return source.parent / "shared" / "data"
    return beside


SHARED_DATA = shared_data_dir()
HH_RLHF_TEST = SHARED_DATA / "hh-rlhf-harmless-base-test.jsonl.gz"
POSTGRES_HOST, POSTGRES_PORT = "127.0.0.1", 5432
POSTGRES_URL = os.environ.get(
    "ALIGNFLOW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_service(available: bool, what: str, how: str) -> None:
    """Skip on a developer machine without the service; never skip under CI."""
    if available:
        return
    if in_ci():
        pytest.fail(f"{what} is required under CI=true but is not reachable")
    pytest.skip(f"{what} not reachable: {how}")


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@pytest.fixture(scope="session")
def hh_rlhf_path() -> Path:
    if not HH_RLHF_TEST.exists():
        pytest.fail(f"shared data missing: {HH_RLHF_TEST} (set ALIGNFLOW_SHARED_DATA)")
    return HH_RLHF_TEST


@pytest.fixture(scope="session")
def postgres_url() -> str:
    require_service(
        port_open(POSTGRES_HOST, POSTGRES_PORT),
        "PostgreSQL on 127.0.0.1:5432",
        "start it (`pg_ctlcluster <version> main start`) or set ALIGNFLOW_TEST_POSTGRES_URL",
    )
    return POSTGRES_URL


@pytest.fixture(scope="session")
def demo_records() -> list[dict]:
    from alignflow.data.demo import iter_demo_pairs

    return list(iter_demo_pairs(600, seed=0))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, demo_records) -> Path:
    """A from-scratch tiny causal LM with a tokenizer trained on the demo data (untrained weights)."""
    from alignflow.models import build_tiny_model

    texts = [f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in demo_records]
    return build_tiny_model(texts, tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def toy_stage():
    """The toy policy algorithm of ``tests/training/toy_algorithm.py``, registered for one test."""
    from alignflow.training.registry import register_stage, unregister_stage
    from tests.training.toy_algorithm import TOY

    register_stage(TOY)
    yield TOY
    unregister_stage(TOY.name)


@pytest.fixture(scope="session")
def gpt2_policy_dir(tiny_model_dir, tmp_path_factory):
    """A tiny GPT-2 (untrained) on the tiny tokenizer: learned absolute positions, only 48 of them."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=48,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    out = tmp_path_factory.mktemp("gpt2-policy")
    # seeded: its weights drew from whatever the worker's tests had left in the global RNG, and
    # one draw answered every prompt of tests/models/test_generate.py with the same empty text
    torch.manual_seed(0)  # of seeds 0-5, only 0 gave distinct answers there: the test needs them
    GPT2LMHeadModel(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """A scalar-head classifier on the tiny backbone (untrained): the shape of a reward model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("reward-model")
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out
