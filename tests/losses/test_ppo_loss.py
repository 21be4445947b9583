import math

import pytest
import torch

from alignflow.losses import PPOLoss


def _ratios(values):
    return torch.log(torch.tensor(values)).requires_grad_(True)


def test_clipped_objective_equals_hand_computed_values():
    # ratio, advantage -> per-token loss with clip 0.2:
    # 1.5, +1 -> max(-1.5, -1.2) = -1.2   (clipped: no gain for pushing further)
    # 0.5, -1 -> max(0.5, 0.8)   =  0.8   (clipped)
    # 1.1, +2 -> max(-2.2, -2.2) = -2.2   (inside the trust region)
    # 0.7, +1 -> max(-0.7, -0.8) = -0.7   (pessimistic side is the unclipped one)
    log_probs = _ratios([1.5, 0.5, 1.1, 0.7])
    old = torch.zeros(4)
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0])
    loss_fn = PPOLoss(clip_param=0.2, entropy_coef=0.0)
    out = loss_fn(log_probs, old, adv, return_dict=True)
    assert out["loss"].item() == pytest.approx(-3.3 / 4)
    assert out["clip_fraction"] == pytest.approx(0.75)
    assert out["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.7) / 4)
    out["loss"].backward()
    # d/dlogp of -A*r is -A*r; clipped tokens give no gradient
    expected_grad = torch.tensor([0.0, 0.0, -2.0 * 1.1, -0.7]) / 4
    torch.testing.assert_close(log_probs.grad, expected_grad)


def test_clipped_value_loss_equals_hand_computed_values():
    log_probs = torch.zeros(2)
    values = torch.tensor([2.0, 0.0])
    old_values = torch.tensor([1.0, 1.0])
    returns = torch.zeros(2)
    # v=2: unclipped (2-0)^2=4, clipped v=1.5 -> 2.25, max 4     -> 0.5*4    = 2.0
    # v=0: unclipped 0,         clipped v=0.5 -> 0.25, max 0.25  -> 0.5*0.25 = 0.125
    loss_fn = PPOLoss(value_clip=0.5, value_loss_coef=0.5, entropy_coef=0.0)
    out = loss_fn(log_probs, torch.zeros(2), torch.zeros(2), values, old_values, returns, return_dict=True)
    assert out["value_loss"] == pytest.approx(2.125 / 2)
    assert out["loss"].item() == pytest.approx(0.5 * 2.125 / 2)
    unclipped = PPOLoss(value_clip=None, value_loss_coef=1.0, entropy_coef=0.0)
    out = unclipped(log_probs, torch.zeros(2), torch.zeros(2), values, old_values, returns, return_dict=True)
    assert out["value_loss"] == pytest.approx(0.5 * 4 / 2)


def test_entropy_bonus_lowers_the_loss_by_coef_times_entropy():
    logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: entropy log 4
    log_probs = torch.full((1, 3), -math.log(4))
    loss_fn = PPOLoss(entropy_coef=0.1)
    out = loss_fn(log_probs, log_probs.clone(), torch.zeros(1, 3), logits=logits, return_dict=True)
    assert out["entropy"] == pytest.approx(math.log(4))
    assert out["loss"].item() == pytest.approx(-0.1 * math.log(4))


def test_masked_tokens_do_not_contribute():
    torch.manual_seed(0)
    log_probs, old, adv = torch.randn(2, 5) * 0.3, torch.randn(2, 5) * 0.3, torch.randn(2, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    garbage = log_probs.clone()
    garbage[mask == 0] = 50.0
    loss_fn = PPOLoss(entropy_coef=0.0)
    masked = loss_fn(garbage, old, adv, mask=mask)
    keep = mask.bool()
    flat = loss_fn(log_probs[keep], old[keep], adv[keep])
    torch.testing.assert_close(masked, flat)


def test_sequence_advantages_broadcast_over_tokens_and_bad_shapes_raise():
    log_probs = torch.zeros(2, 3)
    loss_fn = PPOLoss(entropy_coef=0.0)
    seq = loss_fn(log_probs, torch.zeros(2, 3), torch.tensor([1.0, -3.0]))
    assert seq.item() == pytest.approx(-(1.0 - 3.0) / 2)
    with pytest.raises(ValueError, match="advantages"):
        loss_fn(log_probs, torch.zeros(2, 3), torch.zeros(3))
    with pytest.raises(ValueError, match="old_log_probs and advantages"):
        loss_fn(log_probs)
