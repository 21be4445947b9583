"""Checkpoint folders that appear only once complete: written under a staging name, then renamed.

A crash (even SIGKILL) mid-save leaves the staging folder, never a half-written
``checkpoint-N`` that a resume would trust. Shared by the research trainers and the
pipeline's stages (:mod:`alignflow.training.checkpoints`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from transformers.trainer_utils import rotate_checkpoints

STAGING = ".staging"


def staging_folder(root: Path) -> Path:
    """An empty ``root/.staging`` to write the next checkpoint into (a crash's leftovers removed)."""
    staging = root / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    return staging


def move_into_place(written: Path, final: Path, keep: int | None) -> Path:
    """Rename a fully written checkpoint folder to ``final`` (durably), then keep the newest ``keep``."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(written, final)
    _fsync_dir(final.parent)
    if keep is not None:
        rotate_checkpoints(output_dir=str(final.parent), save_total_limit=keep)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
