"""Running the CLI as a person would: under a pseudo-terminal, and reading what the screen showed.

Stdlib only (``os.openpty``): the child sees a real TTY of the given size on stdin, stdout
and stderr, so rich draws its live view exactly as in a terminal.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")
# what transformers, datasets, huggingface_hub, DVC, Prefect and tqdm print when nobody stops them
LIBRARY_NOISE = (
    "Adding...",
    "Checking graph",
    "Collecting files",
    "file/s]",
    "Waiting to acquire lock",
    "| WARNING |",
    "| ERROR |",
    "py.warnings",
    "Traceback",
    "Loading weights",
    "LOAD REPORT",
    "Consider training on your downstream task",
    "MISSING",
    "Writing model shards",
    "it/s]",
    "s/it]",
    "Map:",
    "Generating train split",
    "{'train_runtime'",
    "{'loss'",
)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "alignflow.cli", *args]


def run_in_terminal(
    command: list[str], cwd: Path, env: dict[str, str], timeout: float = 600, cols: int = 120, rows: int = 40
) -> tuple[int, str]:
    """Run ``command`` on a fresh pseudo-terminal; its exit code and every byte it wrote (decoded)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**env, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise TimeoutError(f"{command} still running after {timeout}s")
        code = proc.wait(timeout=60)
    finally:
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", errors="replace")


def screen_lines(raw: str) -> list[str]:
    """Every line the terminal showed at some moment: escapes removed, redraws split apart."""
    text = ANSI.sub("", raw)
    return [line for line in re.split(r"[\r\n]", text) if line.strip()]


def noise_in(text: str) -> list[str]:
    return [marker for marker in LIBRARY_NOISE if marker in text]
