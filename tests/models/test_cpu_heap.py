"""The heap keeps freed blocks: re-allocating a large buffer stops faulting pages in."""

import os
import subprocess
import sys

import pytest

# 20 rounds of three 16 MiB buffers alive at once, then freed (numpy's data comes from malloc), as
# a training step's temporaries are; prints the minor page faults of the last 19 rounds; with the
# argument "retain", after retain_freed_memory
CHILD = """
import resource, sys
import numpy as np
from alignflow.models.cpu_heap import retain_freed_memory
retained = retain_freed_memory() if sys.argv[1] == "retain" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    blocks = [np.ones(2**21) for _ in range(3)]  # 16 MiB each, written in full
    del blocks
step()
before = faults()
for _ in range(19):
    step()
print(retained, faults() - before)
"""


def _run(mode: str, env: dict[str, str]) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    return out[0], int(out[1])


@pytest.fixture
def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_retained_heap_stops_refaulting_a_freed_block(clean_env):
    _, default_faults = _run("default", clean_env)
    retained, retained_faults = _run("retain", clean_env)
    assert retained == "True"
    pages = 2**24 // 4096
    # by default glibc hands part of the freed heap back and faults it in again every round
    assert default_faults >= 19 * pages // 8
    assert retained_faults < pages // 8  # the freed blocks are reused in place


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_users_own_malloc_setting_is_left_alone(clean_env):
    retained, _ = _run("retain", {**clean_env, "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert retained == "False"
