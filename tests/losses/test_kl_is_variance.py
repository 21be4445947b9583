import pytest
import torch
import torch.nn.functional as F

from alignflow.losses import (
    CompositeLoss,
    CustomLossConfig,
    ImportanceSamplingLoss,
    KLDivergenceLoss,
    PPOLoss,
    VarianceLoss,
)


def test_full_kl_equals_torch_kl_div():
    torch.manual_seed(0)
    logits, ref = torch.randn(3, 4, 7), torch.randn(3, 4, 7)
    loss = KLDivergenceLoss(estimator="full", kl_coef=1.0)(logits, ref)
    expected = F.kl_div(F.log_softmax(ref, -1), F.log_softmax(logits, -1), log_target=True, reduction="none")
    torch.testing.assert_close(loss, expected.sum(-1).mean())


def test_k3_estimator_is_unbiased_for_the_exact_kl():
    torch.manual_seed(0)
    logits, ref = torch.randn(6), torch.randn(6)
    p, q = torch.distributions.Categorical(logits=logits), torch.distributions.Categorical(logits=ref)
    exact = torch.distributions.kl_divergence(p, q)
    samples = p.sample((200_000,))
    estimate = KLDivergenceLoss(kl_coef=1.0)(p.log_prob(samples), q.log_prob(samples))
    assert estimate.item() == pytest.approx(exact.item(), rel=0.03)


def test_kl_coefficient_scales_and_adapts():
    lp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-0.5, -0.5])
    a = KLDivergenceLoss(kl_coef=0.1, estimator="k1")(lp, ref)
    torch.testing.assert_close(a, torch.tensor(0.1 * 0.0))  # k1 of +0.5 and -0.5 averages to 0
    loss = KLDivergenceLoss(target_kl=0.01, kl_coef=0.1)
    assert loss.update(0.02) == pytest.approx(0.2)  # above 1.5x target: double
    assert loss.update(0.01) == pytest.approx(0.2)  # inside the band: unchanged
    assert loss.update(0.001) == pytest.approx(0.1)  # below target/1.5: halve


def test_the_adapted_coefficient_survives_a_state_dict_round_trip(tmp_path):
    kl = KLDivergenceLoss(target_kl=0.01, kl_coef=0.1)
    kl.update(0.5)
    kl.update(0.5)  # adapted to 0.4
    composite = CompositeLoss([PPOLoss(), kl])
    torch.save(composite.state_dict(), tmp_path / "losses.pt")
    resumed = CompositeLoss([PPOLoss(), KLDivergenceLoss(target_kl=0.01, kl_coef=0.1)])
    resumed.load_state_dict(torch.load(tmp_path / "losses.pt"))
    assert resumed.losses[1].kl_coef == pytest.approx(0.4)
    assert resumed.losses[1].update(0.001) == pytest.approx(0.2)  # adapts on from where it was


def test_importance_weights_are_capped_and_capped_tokens_get_no_gradient():
    log_probs = torch.log(torch.tensor([0.5, 2.0, 10.0])).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, 1.0])
    loss_fn = ImportanceSamplingLoss(clip_is_ratio=5.0, normalize_advantages=False)
    out = loss_fn(log_probs, torch.zeros(3), advantages=adv, return_dict=True)
    assert out["loss"].item() == pytest.approx(-(0.5 + 2.0 + 5.0) / 3)
    assert out["clipped_fraction"] == pytest.approx(1 / 3)
    out["loss"].backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([-0.5, -2.0, 0.0]) / 3)


def test_importance_sampling_whitens_advantages_when_asked():
    log_probs = torch.zeros(4)
    adv = torch.tensor([10.0, 10.0, 20.0, 20.0])
    plain = ImportanceSamplingLoss(normalize_advantages=False)(log_probs, torch.zeros(4), advantages=adv)
    whitened = ImportanceSamplingLoss(normalize_advantages=True)(log_probs, torch.zeros(4), advantages=adv)
    assert plain.item() == pytest.approx(-15.0)
    assert abs(whitened.item()) < 1e-5  # ratio 1 everywhere and zero-mean advantages


def test_variance_loss_is_zero_at_target_and_quadratic_away_from_it():
    x = torch.tensor([1.0, -1.0, 1.0, -1.0])  # population variance 1
    assert VarianceLoss(target_variance=1.0, beta=0.1)(x).item() == pytest.approx(0.0)
    assert VarianceLoss(target_variance=3.0, beta=0.5)(x).item() == pytest.approx(0.5 * 4.0)
    mask = torch.tensor([1, 1, 0, 0])
    y = torch.tensor([2.0, -2.0, 100.0, 100.0])
    assert VarianceLoss(target_variance=0.0, beta=1.0)(y, mask=mask).item() == pytest.approx(16.0)


def test_spec_composite_of_ppo_and_kl_runs_and_backpropagates():
    torch.manual_seed(0)
    log_probs = (torch.randn(2, 4) * 0.1).requires_grad_(True)
    old = torch.randn(2, 4) * 0.1
    comp = CompositeLoss(
        [PPOLoss(clip_param=0.2, value_loss_coef=0.5), KLDivergenceLoss(target_kl=0.01, kl_coef=0.1)],
        weights=[1.0, 0.1],
        config=CustomLossConfig(name="rlhf"),
    )
    out = comp(log_probs, old, advantages=torch.randn(2, 4), mask=torch.ones(2, 4), return_dict=True)
    assert {"ppo/loss", "kl/loss", "kl/kl"} <= out.keys()
    assert out["loss"].item() == pytest.approx(out["ppo/loss"] + 0.1 * out["kl/loss"], rel=1e-5)
    out["loss"].backward()
    assert log_probs.grad is not None and torch.isfinite(log_probs.grad).all()
