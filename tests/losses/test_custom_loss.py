import pytest
import torch

from alignflow.losses import CompositeLoss, CustomLoss, CustomLossConfig


class SquaredError(CustomLoss):
    def compute_loss(self, predictions, targets, mask=None, **kwargs):
        return (predictions - targets) ** 2


def _data():
    pred = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 5.0]])
    target = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return pred, target, mask


def test_reductions_respect_the_mask():
    pred, target, mask = _data()
    kept = torch.tensor([1.0, 4.0, 0.0, 1.0, 25.0])
    mean = SquaredError(CustomLossConfig(reduction="mean"))(pred, target, mask)
    total = SquaredError(CustomLossConfig(reduction="sum"))(pred, target, mask)
    none = SquaredError(CustomLossConfig(reduction="none"))(pred, target, mask)
    torch.testing.assert_close(mean, kept.mean())
    torch.testing.assert_close(total, kept.sum())
    assert none.shape == (2, 3) and none[0, 2] == 0 and none[1, 2] == 25


def test_weight_and_clipping_apply_before_reduction():
    pred, target, mask = _data()
    loss = SquaredError(CustomLossConfig(weight=2.0, clip_value=4.0, reduction="sum"))(pred, target, mask)
    # masked values 1, 4, 0, 1, 25 -> clipped to 1, 4, 0, 1, 4 -> sum 10 -> weighted 20
    torch.testing.assert_close(loss, torch.tensor(20.0))


def test_normalize_rescales_to_unit_mean_magnitude_but_keeps_gradient_direction():
    pred, target, mask = _data()
    pred.requires_grad_(True)
    plain = SquaredError()(pred, target, mask)
    normed = SquaredError(CustomLossConfig(normalize=True))(pred, target, mask)
    torch.testing.assert_close(normed, torch.tensor(1.0))
    (g_plain,) = torch.autograd.grad(plain, pred)
    (g_norm,) = torch.autograd.grad(normed, pred)
    torch.testing.assert_close(g_norm * plain.detach(), g_plain)


def test_return_dict_carries_loss_and_raw_value():
    pred, target, mask = _data()
    out = SquaredError(CustomLossConfig(weight=3.0))(pred, target, mask, return_dict=True)
    assert out["raw_loss"] == pytest.approx(31.0 / 5)
    assert out["loss"].item() == pytest.approx(3 * 31.0 / 5)


def test_composite_is_the_weighted_sum_of_its_components():
    pred, target, mask = _data()
    a = SquaredError(CustomLossConfig(name="a"))
    b = SquaredError(CustomLossConfig(name="b", reduction="sum"))
    comp = CompositeLoss([a, b], weights=[0.5, 2.0])
    out = comp(pred, target, mask, return_dict=True)
    expected = 0.5 * a(pred, target, mask) + 2.0 * b(pred, target, mask)
    torch.testing.assert_close(out["loss"], expected)
    assert out["a/loss"] == pytest.approx(31.0 / 5)
    assert out["b/loss"] == pytest.approx(31.0)


def test_composite_names_duplicate_components_apart():
    comp = CompositeLoss([SquaredError(), SquaredError()])
    assert comp.component_names() == ["SquaredError", "SquaredError_2"]


def test_bad_configuration_is_rejected_with_the_field_named():
    with pytest.raises(ValueError, match="reduction"):
        CustomLossConfig(reduction="avg")
    with pytest.raises(ValueError, match="clip_value"):
        CustomLossConfig(clip_value=-1.0)
    with pytest.raises(ValueError, match="weights"):
        CompositeLoss([SquaredError()], weights=[1.0, 2.0])
