"""DPO: loss equality with TRL's own code path, dataset encoding and a learning test."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import DPOTrainer as TRLDPOTrainer

from alignflow.losses.dpo_loss_types import DPO_LOSS_TYPES
from alignflow.losses.dpo_losses import DISCOPOP_TAU
from alignflow.models.factory import load_causal_lm
from alignflow.rl.dpo import DPOConfig, DPOTrainer, PreferenceDataset, dpo_loss


def _random_pairs(batch=4, width=9, seed=0):
    """Per-token log-probs and completion masks for chosen (first half) and rejected rows."""
    g = torch.Generator().manual_seed(seed)
    completion = torch.zeros(2 * batch, width, dtype=torch.long)
    for row in range(2 * batch):
        start = int(torch.randint(2, 5, (1,), generator=g))
        end = int(torch.randint(start + 1, width + 1, (1,), generator=g))
        completion[row, start:end] = 1
    per_token = -torch.rand(2 * batch, width - 1, generator=g) * 3 * completion[:, 1:]
    ref = -torch.rand(2 * batch, generator=g) * 10
    return per_token, completion, ref


def _trl_loss(per_token, completion, ref, loss_type, beta, label_smoothing):
    """Run TRL 1.x's DPOTrainer._compute_loss on a stub model that returns ``per_token``."""
    batch = per_token.size(0) // 2

    def stub_model(**kwargs):
        return SimpleNamespace(
            log_probs=per_token,
            entropy=torch.zeros_like(per_token),
            mean_logits=torch.zeros_like(per_token),
            is_top1=torch.zeros_like(per_token, dtype=torch.bool),
        )

    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True),
        accelerator=SimpleNamespace(
            device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x
        ),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=label_smoothing,
        use_weighting=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
        args=SimpleNamespace(discopop_tau=DISCOPOP_TAU),
    )
    inputs = {
        "input_ids": torch.zeros_like(completion),
        "attention_mask": torch.ones_like(completion),
        "completion_mask": completion,
        "ref_chosen_logps": ref[:batch],
        "ref_rejected_logps": ref[batch:],
    }
    loss = TRLDPOTrainer._compute_loss(trainer, stub_model, inputs, return_outputs=False)
    return loss, trainer._metrics["train"]


def _our_loss(per_token, completion, ref, loss_type, beta, label_smoothing):
    batch = per_token.size(0) // 2
    logps = (per_token * completion[:, 1:]).sum(-1)
    lengths = completion.sum(-1)
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        logps[:batch],
        logps[batch:],
        ref[:batch],
        ref[batch:],
        beta=beta,
        label_smoothing=label_smoothing,
        loss_type=loss_type,
        chosen_lengths=lengths[:batch],
        rejected_lengths=lengths[batch:],
    )
    return losses.mean(), chosen_rewards, rejected_rewards


# label smoothing where a loss reads it (exo_pair needs it above 0); TRL's sigmoid ignores it
SMOOTHING = {"robust": 0.2, "exo_pair": 1e-3, "aot": 0.1, "aot_unpaired": 0.1}


@pytest.mark.parametrize(
    ("loss_type", "beta", "label_smoothing"),
    [(name, 0.1, SMOOTHING.get(name, 0.0)) for name in DPO_LOSS_TYPES]
    + [("sigmoid", 0.5, 0.0), ("hinge", 0.3, 0.0)],
)
def test_dpo_loss_equals_trl_compute_loss_on_identical_logprobs(loss_type, beta, label_smoothing):
    """Every loss of the one list the pipeline (TRL) and the research trainer share."""
    per_token, completion, ref = _random_pairs(seed=len(loss_type) + int(beta * 10))
    trl_loss, trl_metrics = _trl_loss(per_token, completion, ref, loss_type, beta, label_smoothing)
    ours, chosen_rewards, rejected_rewards = _our_loss(
        per_token, completion, ref, loss_type, beta, label_smoothing
    )
    torch.testing.assert_close(ours, trl_loss)
    assert chosen_rewards.mean().item() == pytest.approx(trl_metrics["rewards/chosen"][0], rel=1e-5)
    accuracy = (chosen_rewards > rejected_rewards).float().mean().item()
    assert accuracy == pytest.approx(trl_metrics["rewards/accuracies"][0])


@pytest.mark.parametrize("label_smoothing", [0.1, 0.3])
def test_conservative_dpo_equals_trls_label_smoothed_form_pair_by_pair(label_smoothing):
    # TRL 1.x's "sigmoid" loss has no label smoothing; its "aot" loss applies the same
    # smoothed logistic to sorted log-ratios, which for a single pair is the pair itself.
    per_token, completion, ref = _random_pairs(batch=3, seed=7)
    for i in range(3):
        rows = [i, 3 + i]
        args = (per_token[rows], completion[rows], ref[rows], "aot", 0.2, label_smoothing)
        trl_loss, _ = _trl_loss(*args)
        ours, _, _ = _our_loss(per_token[rows], completion[rows], ref[rows], "sigmoid", 0.2, label_smoothing)
        torch.testing.assert_close(ours, trl_loss)


def test_dpo_loss_by_hand_and_reference_free():
    chosen, rejected = torch.tensor([-3.0]), torch.tensor([-5.0])
    ref_c, ref_r = torch.tensor([-4.0]), torch.tensor([-4.0])
    losses, rc, rr = dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5)
    # delta = (-3 + 4) - (-5 + 4) = 2 -> -log sigmoid(1)
    assert losses.item() == pytest.approx(math.log1p(math.exp(-1.0)))
    assert (rc.item(), rr.item()) == pytest.approx((0.5, -0.5))
    free, rc, _ = dpo_loss(chosen, rejected, beta=0.5)
    assert free.item() == pytest.approx(math.log1p(math.exp(-1.0)))  # delta = -3 - (-5) = 2 as well
    assert rc.item() == pytest.approx(-1.5)
    smoothed, _, _ = dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5, label_smoothing=0.25)
    expected = 0.75 * math.log1p(math.exp(-1.0)) + 0.25 * math.log1p(math.exp(1.0))
    assert smoothed.item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="ipo"):
        dpo_loss(chosen, rejected, loss_type="ipo")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir


def test_preference_dataset_masks_truncates_and_reports_bad_rows(tiny):
    _, tok = load_causal_lm(tiny)
    ds = PreferenceDataset(
        ["What is 3 plus 4? " * 5],
        [" The answer is 7."],
        [" I think 6"],
        tok,
        max_length=40,
        max_prompt_length=8,
    )
    item = ds[0]
    prompt_len = item["chosen_completion_mask"].index(1)
    assert prompt_len == 8  # kept the last 8 prompt tokens
    assert item["chosen_input_ids"][-1] == tok.eos_token_id
    assert tok.decode(item["chosen_input_ids"][prompt_len:-1]) == " The answer is 7."
    batch = ds.collate([item, item])
    assert batch["chosen_input_ids"].shape == batch["rejected_input_ids"].shape
    assert batch["rejected_attention_mask"].sum() == 2 * len(item["rejected_input_ids"])
    with pytest.raises(ValueError, match=r"rejected\[1\]"):
        PreferenceDataset(["a", "b"], ["c", "d"], ["e", ""], tok)
    with pytest.raises(ValueError, match="differ in length"):
        PreferenceDataset(["a"], ["c", "d"], ["e"], tok)
    with pytest.raises(ValueError, match="label_smoothing"):
        DPOConfig(label_smoothing=0.5)


def _datasets(trainer, records):
    def make(rows):
        return trainer.make_dataset(
            [r["prompt"] for r in rows],
            [" " + r["chosen"] for r in rows],
            [" " + r["rejected"] for r in rows],
        )

    return make(records[:400]), make(records[400:])


@pytest.mark.slow
def test_dpo_raises_implicit_reward_accuracy_on_a_tiny_model(tiny, demo_records, logs_seen):
    model, tok = load_causal_lm(tiny)
    config = DPOConfig(
        learning_rate=1e-3,
        beta=0.1,
        batch_size=16,
        gradient_accumulation_steps=1,
        max_length=48,
        max_prompt_length=24,
        eval_every=20,
        device="cpu",
    )
    trainer = DPOTrainer(config, tokenizer=tok, model=model, callbacks=[logs_seen])
    train, held_out = _datasets(trainer, demo_records)
    before = trainer.evaluate(held_out)
    assert before["loss"] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at the start
    result = trainer.train(train, held_out)
    assert [log["loss"] for log in logs_seen.seen if "loss" in log] == [
        row["loss"] for row in result["history"] if "loss" in row
    ], "the caller's callbacks see the loop's logs"
    after = result["eval"]
    assert after["rewards/accuracies"] > before["rewards/accuracies"] + 0.2
    assert after["rewards/accuracies"] > 0.6
    assert after["rewards/margins"] > 0 and after["loss"] < math.log(2) - 0.02
    assert any("eval/loss" in row for row in result["history"])
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    assert any(
        not torch.equal(a, b)
        for a, b in zip(trainer.ref_model.parameters(), trainer.model.parameters(), strict=True)
    )


@pytest.mark.slow
def test_reference_free_dpo_trains_without_a_reference_model(tiny, demo_records, tmp_path):
    model, tok = load_causal_lm(tiny)
    config = DPOConfig(
        learning_rate=1e-3,
        reference_free=True,
        batch_size=16,
        gradient_accumulation_steps=2,
        max_length=48,
        max_prompt_length=24,
        device="cpu",
        output_dir=str(tmp_path),
        save_every=5,
    )
    trainer = DPOTrainer(config, tokenizer=tok, model=model)
    assert trainer.ref_model is None
    train, held_out = _datasets(trainer, demo_records[:500])
    before = trainer.evaluate(held_out)
    result = trainer.train(train, held_out)
    assert result["steps"] == math.ceil(math.ceil(400 / 16) / 2)
    assert result["eval"]["rewards/margins"] > before["rewards/margins"]
    assert (tmp_path / "checkpoint-10" / "model.safetensors").is_file()
