"""Reference log-probabilities: computed once per (reference weights, tokenized pairs), then reused.

DPO compares the policy with a frozen reference on every pair. The reference does not move
during a run, and a rerun that changes only ``beta``, the loss or the learning rate sees the
same reference on the same pairs. So the reference's log-probs are computed in one no-grad
pass over length-sorted batches (little padding, no backward) and stored under a key made
of the reference's weights, the tokenized rows and the settings that change the numbers.
The next run with that key reads them back instead of running the reference at all, and
training keeps no reference model in memory.

The cache lives in ``$ALIGNFLOW_CACHE`` (default ``$XDG_CACHE_HOME/alignflow``, else
``~/.cache/alignflow``), under ``reference-logps/``; a stage config may name another folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alignflow.training.batching import padded_lengths
from alignflow.training.model_preparation import PreparedModelsMixin

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is stored, or how it is computed, changes
TOKEN_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")

if TYPE_CHECKING:  # the mixin is mixed into TRL's DPOTrainer: its attributes and hooks
    from trl import DPOTrainer as _DPOTrainerBase
else:
    _DPOTrainerBase = object


def cache_home() -> Path:
    """alignflow's user cache folder (the XDG convention Hugging Face tools follow too)."""
    if os.environ.get("ALIGNFLOW_CACHE"):
        return Path(os.environ["ALIGNFLOW_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "alignflow"


def reference_cache_dir(configured: str | Path | None = None) -> Path:
    return Path(configured) if configured else cache_home() / "reference-logps"


def rows_digest(dataset: Any, columns: tuple[str, ...] = TOKEN_COLUMNS) -> str:
    """SHA-256 of the token ids of every row, in order: equal digests mean identical tokenized data."""
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")[:]
    digest = hashlib.sha256()
    for name in columns:
        column = table.column(name).combine_chunks()
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy()
        values = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.int64)
        digest.update(name.encode())
        digest.update(lengths.astype(np.int64).tobytes())
        digest.update(values.tobytes())
    return digest.hexdigest()


def cache_key(model_hash: str, data_digest: str, settings: Mapping[str, Any]) -> str:
    """The file name the reference's log-probs of these rows are kept under."""
    payload = json.dumps(
        {"format": FORMAT, "model": model_hash, "rows": data_digest, "settings": dict(settings)},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Row indices in batches of similar padded length (longest first, so memory peaks at once)."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


def compute_reference_logps(
    dataset: Any,
    collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]],
    score_batch: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    device: torch.device | str = "cpu",
    max_length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) log-probs of every row, in the dataset's order, from length-sorted batches."""
    n = len(dataset)
    chosen, rejected = torch.empty(n), torch.empty(n)
    lengths = padded_lengths(dataset, max_length) or [0] * n
    for index in length_sorted_batches(lengths, batch_size):
        batch = collate([dataset[i] for i in index])
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        with torch.no_grad():
            c, r = score_batch(batch)
        chosen[index], rejected[index] = c.float().cpu(), r.float().cpu()
    return chosen, rejected


def load_cached(path: Path, n_rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stored log-probs, or None when absent or unreadable (then they are computed again)."""
    if not path.exists():
        return None
    from safetensors.torch import load_file

    try:
        stored = load_file(str(path))
    except Exception as exc:  # a torn or foreign file: recompute rather than fail the stage
        log.warning("reference log-probs cache %s unreadable (%s): computing them again", path, exc)
        return None
    chosen, rejected = stored.get("chosen"), stored.get("rejected")
    if chosen is None or rejected is None or len(chosen) != n_rows or len(rejected) != n_rows:
        log.warning("reference log-probs cache %s does not match the data: computing them again", path)
        return None
    return chosen, rejected


def store(path: Path, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
    """Write atomically: a crash leaves the old file or none, never half of one."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    save_file({"chosen": chosen.contiguous(), "rejected": rejected.contiguous()}, str(partial))
    os.replace(partial, path)


class CachedReferenceMixin(PreparedModelsMixin, _DPOTrainerBase):
    """For TRL's DPOTrainer run with ``precompute_ref_log_probs``: precompute through the cache.

    TRL computes the reference log-probs in its constructor, in dataset order, and keeps
    them only in a temporary cache of ``datasets``. This computes them in length-sorted
    batches with TRL's own per-batch function (so PEFT, length-desensitised DPO and mixed
    precision are handled alike), stores them, and reads them back in later runs.
    ``reference_cache_dir`` (a constructor keyword) names the folder; ``reference_cache_events``
    records what happened to each split, for the stage's metrics.
    """

    def __init__(self, *args: Any, reference_cache_dir: str | Path | None = None, **kwargs: Any) -> None:
        self.reference_cache_dir = reference_cache_dir  # read by the base constructor's precompute
        super().__init__(*args, **kwargs)

    def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int):
        if self.accelerator.num_processes > 1:  # TRL's own path broadcasts and gathers across ranks
            return super()._precompute_ref_logps(dataset, name, batch_size)
        settings = {  # what else changes the numbers: the collator truncates, the loss may weight tokens
            "max_length": getattr(self.args, "max_length", None),
            "truncation_mode": getattr(self.args, "truncation_mode", None),
            "ld_alpha": getattr(self, "ld_alpha", None),
            "bf16": bool(self.args.bf16),
            "fp16": bool(self.args.fp16),
            "trainer": type(self).__name__,
        }
        model_hash = self._precompute_model_hash
        assert model_hash is not None  # DPOTrainer sets it whenever it precomputes (the only caller)
        path = reference_cache_dir(self.reference_cache_dir) / (
            cache_key(model_hash, rows_digest(dataset), settings) + ".safetensors"
        )
        started = time.perf_counter()
        cached = load_cached(path, len(dataset))
        computed = cached is None
        if cached is None:  # i.e. computed (this form narrows the type)
            self.prepare_models()  # TRL runs this pass inside its constructor: switch the models first
            model = self.ref_model or self.model
            assert model is not None  # the trainer was built with its model
            was_training = model.training
            model.eval()  # a reference has no dropout (TRL's live reference runs in eval mode too)
            try:
                cached = compute_reference_logps(
                    dataset,
                    self.data_collator,
                    lambda batch: self.compute_ref_log_probs(model, batch),
                    batch_size,
                    self.accelerator.device,
                    getattr(self.args, "max_length", None),
                )
            finally:
                model.train(was_training)
            store(path, *cached)
        self._record_reference_event(name, computed, len(dataset), time.perf_counter() - started, path)
        chosen, rejected = cached
        return dataset.add_column("ref_chosen_logps", chosen.tolist()).add_column(
            "ref_rejected_logps", rejected.tolist()
        )

    def _record_reference_event(
        self, split: str, computed: bool, rows: int, seconds: float, path: Path
    ) -> None:
        events = self.__dict__.setdefault("reference_cache_events", {})
        events[split] = {"cached": not computed, "rows": rows, "seconds": seconds, "path": str(path)}
        what = "computed" if computed else "read from the cache"
        log.info("reference log-probs of %d %s pairs %s in %.1fs (%s)", rows, split, what, seconds, path)
