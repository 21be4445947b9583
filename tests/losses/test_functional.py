import torch

from alignflow.losses.functional import entropy_from_logits, logprobs_from_logits, masked_mean, whiten


def test_logprobs_and_entropy_match_torch_distributions():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    labels = torch.randint(0, 11, (3, 5))
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logprobs_from_logits(logits, labels), dist.log_prob(labels))
    torch.testing.assert_close(entropy_from_logits(logits), dist.entropy())


def test_whiten_gives_zero_mean_unit_variance_on_the_mask():
    torch.manual_seed(0)
    values = torch.randn(4, 6) * 3 + 2
    mask = torch.ones(4, 6)
    mask[:, -2:] = 0
    out = whiten(values, mask)
    assert abs(masked_mean(out, mask).item()) < 1e-5
    kept = out[mask.bool()]
    assert abs(kept.var().item() - 1.0) < 1e-4
