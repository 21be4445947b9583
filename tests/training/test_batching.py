"""Length-grouped batches: every row once per epoch, far less padding than random batches."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from datasets import Dataset

from alignflow.training.batching import LengthGroupedMixin, padded_lengths


def _pairs(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):  # mixed lengths, as in real preference data: short answers and long chats
        prompt = rng.choice([5, 20, 300])
        rows.append(
            {
                "prompt_ids": [1] * prompt,
                "chosen_ids": [2] * rng.randint(1, 200),
                "rejected_ids": [3] * rng.randint(1, 200),
            }
        )
    return Dataset.from_list(rows)


def test_padded_length_is_the_prompt_plus_the_wider_answer_capped_at_max_length():
    data = Dataset.from_list(
        [
            {"prompt_ids": [1, 1], "chosen_ids": [2, 2, 2], "rejected_ids": [3]},
            {"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3, 3, 3, 3]},
        ]
    )
    assert padded_lengths(data) == [5, 5]
    assert padded_lengths(data, max_length=4) == [4, 4]
    reward = Dataset.from_list([{"chosen_ids": [1, 2], "rejected_ids": [3, 4, 5]}])
    assert padded_lengths(reward) == [3]
    assert padded_lengths(Dataset.from_list([{"prompt": "text only"}])) is None


def test_whole_sequences_of_orpo_and_cpo_rows_are_what_they_pad_to():
    """TRL's older pair trainers keep prompt + answer in one column per side; the prompt's own
    column is not added again."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    rows = [([1, 1], [1, 1, 2, 2, 2], [1, 1, 3]), ([1], [1, 2], [1, 3, 3, 3, 3, 3])]
    data = Dataset.from_list(
        [{"prompt_input_ids": p, "chosen_input_ids": c, "rejected_input_ids": r} for p, c, r in rows]
    )
    assert padded_lengths(data) == [5, 6]
    assert padded_lengths(data, max_length=4) == [4, 4]
    assert isinstance(_Trainer(data, "group_by_length")._get_train_sampler(), LengthGroupedSampler)


class _Base:
    def _get_train_sampler(self, train_dataset=None):
        return "the base class's sampler"


class _Trainer(LengthGroupedMixin, _Base):
    def __init__(self, dataset: Dataset, strategy: str, batch: int = 8):
        self.train_dataset = dataset
        self.args = SimpleNamespace(
            train_sampling_strategy=strategy,
            train_batch_size=batch,
            gradient_accumulation_steps=1,
            max_length=None,
            seed=0,
            data_seed=None,
        )


def _padding(lengths: list[int], order: list[int], batch: int) -> int:
    batches = [order[i : i + batch] for i in range(0, len(order), batch)]
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_grouped_batches_cover_every_row_once_with_a_fraction_of_the_padding():
    import torch

    torch.manual_seed(0)
    data = _pairs(640)
    lengths = padded_lengths(data)
    sampler = _Trainer(data, "group_by_length")._get_train_sampler()
    order = list(sampler)
    assert sorted(order) == list(range(len(data)))
    shuffled = list(range(len(data)))
    random.Random(1).shuffle(shuffled)
    assert _padding(lengths, order, 8) < 0.25 * _padding(lengths, shuffled, 8)
    sampler.set_epoch(1)
    assert list(sampler) != order  # still shuffled from epoch to epoch, not one fixed sort


@pytest.mark.parametrize("strategy", ["random", "sequential"])
def test_other_strategies_are_the_base_class_own(strategy):
    assert _Trainer(_pairs(10), strategy)._get_train_sampler() == "the base class's sampler"


def test_preference_stages_group_by_length_unless_told_not_to(demo_config, tmp_path):
    from alignflow.training.stage import trainer_arguments

    config = demo_config()
    on = trainer_arguments(config.dpo, tmp_path, config.model, 0, has_eval=False)
    assert on["train_sampling_strategy"] == "group_by_length"
    off = demo_config("dpo.group_by_length=false")
    assert "train_sampling_strategy" not in trainer_arguments(off.dpo, tmp_path, off.model, 0, has_eval=False)
    assert config.reward.group_by_length
    # SFT keeps random batches: grouped batches of the demo task taught it less in the same steps
    assert "train_sampling_strategy" not in trainer_arguments(
        config.sft, tmp_path, config.model, 0, has_eval=False
    )


def test_an_epoch_s_order_depends_on_the_seed_and_epoch_alone():
    """A run resumed in a later epoch draws that epoch's order as the uninterrupted run did,
    whatever torch's global RNG went through before (dropout, sampling, a fresh process)."""
    import torch

    dataset = _pairs(64)
    orders = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        sampler = _Trainer(dataset, "group_by_length")._get_train_sampler()
        sampler.set_epoch(3)
        orders.append(list(sampler))
    assert orders[0] == orders[1]
    sampler.set_epoch(4)
    assert list(sampler) != orders[0], "another epoch, another order"
