"""Deterministic kernels per stage: asked for where they are free, stated where they are not.

On a CPU torch's deterministic kernels cost a stage nothing, so they are on by default (an
operation without one warns and runs). On a GPU they cost speed (cuBLAS's fixed workspace,
cuDNN's deterministic algorithms, sorted scatter-adds) and some kernels have none (cuDNN
attention), so they are off by default, as in transformers (``full_determinism``). A stage
that sets ``deterministic: true`` gets them on any device, strictly: an operation without one
stops the stage with an error naming it, so a run that finishes was deterministic as far as
torch knows. Each stage run's ``compute.deterministic`` tag says which mode it trained in.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from alignflow.errors import InputError

DETERMINISM_TAG = "compute.deterministic"
STRICT, WARN_ONLY, OFF = "strict", "on, warn only", "off"
# the start of the message torch raises for an operation without a deterministic kernel
_NO_DETERMINISTIC_KERNEL = "does not have a deterministic implementation"


def use_determinism(requested: bool | None) -> str:
    """Switch torch's deterministic kernels for the stage about to run (a process-wide setting:
    every stage sets its own) and return the mode now in force: ``STRICT`` where asked for,
    ``WARN_ONLY`` by default without a GPU, ``OFF`` by default with one or where asked."""
    on_gpu = torch.cuda.is_available()
    on = (not on_gpu) if requested is None else requested
    strict = requested is True
    if on and on_gpu:
        # cuBLAS is deterministic only with a fixed workspace, read when its first handle opens
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on, warn_only=not strict)
    torch.backends.cudnn.deterministic = on
    if on:
        torch.backends.cudnn.benchmark = False
    # deterministic mode also NaN-fills every fresh allocation (a debugging aid for reads of
    # uninitialised memory); it tripled DPO step time on CPU and changes no result
    # torch swaps this module's class at import time to add the property: its typing cannot see it
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    return STRICT if strict else WARN_ONLY if on else OFF


def resume_caveat() -> str | None:
    """Why a stage resumed from a checkpoint may not end bit-identical to an uninterrupted run,
    or None where it should (torch's deterministic kernels in force, as :func:`use_determinism`
    set them for the stage)."""
    if torch.are_deterministic_algorithms_enabled():
        return None
    return (
        "torch's deterministic kernels were off for this stage (its deterministic setting, or "
        "unset on a GPU), so the resumed steps may round differently from an uninterrupted run's"
    )


@contextmanager
def refusing_nondeterminism() -> Iterator[None]:
    """Under strict determinism, torch's error for an operation without a deterministic kernel
    as an :class:`InputError` that names the operation and the setting that asked for it."""
    try:
        yield
    except RuntimeError as error:
        message = str(error)
        if _NO_DETERMINISTIC_KERNEL not in message:
            raise
        operation = message.partition(_NO_DETERMINISTIC_KERNEL)[0].strip() or "an operation"
        raise InputError(
            f"{operation} has no deterministic kernel on this device, and the stage asks for "
            "deterministic ones (deterministic: true in its config section): set it to false, "
            "or leave it unset for the device's default"
        ) from error
