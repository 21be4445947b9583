"""Batches of similar length: the same rows each epoch, far less padding per step.

Preference data mixes one-line answers with long multi-turn conversations. Drawn at
random, a batch pads every row to its longest one, and on real data (HH-RLHF) most of a
step's compute goes into padding. transformers' ``group_by_length`` sampler draws
mega-batches at random and sorts each by length, but it reads the length of one
``input_ids`` column, and the preference trainers keep their tokens in several
(``prompt_ids`` + ``chosen_ids``/``rejected_ids``; TRL's older pair trainers, ORPO and CPO,
whole ``chosen_input_ids``/``rejected_input_ids`` sequences with the prompt in them).
:class:`LengthGroupedMixin` gives the sampler the width a row really pads to.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

# a row's body: the widest of these is what its batch pads to (chosen and rejected share a batch)
BODY_COLUMNS = ("input_ids", "chosen_ids", "rejected_ids", "completion_ids")
PREFIX_COLUMN = "prompt_ids"
# whole sequences, prompt included (ORPO's and CPO's rows; their prompt_input_ids is not added)
SEQUENCE_COLUMNS = ("chosen_input_ids", "rejected_input_ids")

if TYPE_CHECKING:  # the mixin is mixed into a transformers Trainer: its attributes and hooks
    from transformers import Trainer as _TrainerBase
else:
    _TrainerBase = object


def padded_lengths(dataset: Any, max_length: int | None = None) -> list[int] | None:
    """Per row, the tokens it pads to in a batch: its prompt plus its widest body column (or its
    widest whole sequence), at most ``max_length`` (the trainers' collators truncate there).

    None when the dataset holds no token columns (raw text, a prompt-only dataset).
    """
    import pyarrow.compute as pc
    from datasets import Dataset

    if not isinstance(dataset, Dataset):
        return None
    body = [c for c in BODY_COLUMNS if c in dataset.column_names]
    whole = [c for c in SEQUENCE_COLUMNS if c in dataset.column_names]
    if not body and not whole:
        return None
    table = dataset.with_format("arrow")[:]
    widths = np.zeros(len(dataset), dtype=np.int64)
    if body:
        widths = np.max([_list_lengths(pc, table.column(c)) for c in body], axis=0)
        if PREFIX_COLUMN in dataset.column_names:
            widths = widths + _list_lengths(pc, table.column(PREFIX_COLUMN))
    for column in whole:
        widths = np.maximum(widths, _list_lengths(pc, table.column(column)))
    if max_length:
        widths = np.minimum(widths, max_length)
    return widths.astype(int).tolist()


def _list_lengths(pc: Any, column: Any) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(column), 0).to_numpy()


class LengthGroupedMixin(_TrainerBase):
    """A trainer whose ``group_by_length`` sampling reads :func:`padded_lengths`.

    Put it before the TRL/transformers base class. With any other sampling strategy the
    base class samples as it always does; a dataset without token columns is shuffled.
    """

    def _get_train_sampler(self, train_dataset: Any = None):
        # a sized dataset: transformers asks for a sampler only for those (not an IterableDataset)
        dataset: Any = self.train_dataset if train_dataset is None else train_dataset
        if getattr(self.args, "train_sampling_strategy", None) == "group_by_length":
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            lengths = padded_lengths(dataset, getattr(self.args, "max_length", None))
            if lengths is not None:
                batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
                return _epoch_seeded("length_grouped")(seed, batch, lengths=lengths)
            return _epoch_seeded("random")(seed, dataset)
        return super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset: Any):
        """Evaluation in length-grouped batches too, in an order fixed by the data seed."""
        grouped = getattr(self.args, "train_sampling_strategy", None) == "group_by_length"
        if not grouped or eval_dataset is None:
            return super()._get_eval_sampler(eval_dataset)
        if self.args.world_size > 1:
            return None  # as transformers does: the distributed loader shards in order
        import torch
        from torch.utils.data import SequentialSampler
        from transformers.trainer_pt_utils import LengthGroupedSampler

        lengths = padded_lengths(eval_dataset, getattr(self.args, "max_length", None))
        if lengths is None:
            return SequentialSampler(eval_dataset)
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return LengthGroupedSampler(
            self.args.eval_batch_size, lengths=lengths, generator=torch.Generator().manual_seed(seed)
        )


def _epoch_generator(seed: int, epoch: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class _EpochSeeded:
    """A sampler whose order is a function of (seed, epoch) alone, never of torch's global RNG.

    Drawn from the global RNG, an epoch's order depended on everything drawn before it (dropout,
    sampling): a run resumed in its second epoch or later drew that epoch's order again from a
    freshly seeded RNG, trained on other batches than the uninterrupted run and ended with other
    weights. transformers calls ``set_epoch`` before each epoch, the resumed one included."""

    def __init__(self, seed: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs, generator=_epoch_generator(seed, 0))  # type: ignore[call-arg]
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        self.generator = _epoch_generator(self.seed, epoch)


@cache
def _epoch_seeded(base: str) -> type:
    """``_EpochSeeded`` over transformers' length-grouped sampler or torch's random one, built
    on first use (the module imports neither)."""
    from torch.utils.data import RandomSampler
    from transformers.trainer_pt_utils import LengthGroupedSampler

    sampler: type = LengthGroupedSampler if base == "length_grouped" else RandomSampler
    return type(f"EpochSeeded{sampler.__name__}", (_EpochSeeded, sampler), {"__module__": __name__})
