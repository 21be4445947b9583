"""The best held-out step a stage hands on: kept whole on disk, resumed, restored."""

from __future__ import annotations

import torch

from alignflow.training.held_out_best import HeldOutBest


def _model(value: float) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0].requires_grad_(False)  # a frozen base: only what trains is kept
    torch.nn.init.constant_(model[1].weight, value)
    return model


def test_only_a_better_score_replaces_the_best_and_restore_puts_its_weights_back(tmp_path):
    best = HeldOutBest(tmp_path)
    assert best.offer(0, 0.5, _model(1.0))
    assert not best.offer(2, 0.5, _model(2.0))  # a tie keeps the earlier step
    assert best.offer(4, 0.7, _model(3.0)) and not best.offer(6, 0.1, _model(4.0))
    assert (best.step, best.score) == (4, 0.7)
    model = _model(9.0)
    frozen = model[0].weight.clone()
    best.restore(model)
    assert torch.all(model[1].weight == 3.0) and torch.equal(model[0].weight, frozen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]  # no staging left behind


def test_a_resumed_run_keeps_a_best_up_to_its_checkpoint_and_drops_one_past_it(tmp_path):
    HeldOutBest(tmp_path).offer(4, 0.7, _model(3.0))
    kept = HeldOutBest(tmp_path)
    kept.resume(upto=6)
    assert (kept.step, kept.score) == (4, 0.7)
    dropped = HeldOutBest(tmp_path)
    dropped.resume(upto=2)  # steps 3-6 are trained again: their best is not this run's
    assert dropped.step is None and not (tmp_path / "best").exists()
