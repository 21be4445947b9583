"""The CPU label head gives TRL's fused head's numbers (log-probs, entropy, metrics, gradients)
while projecting only the labelled positions, and steps aside where it cannot."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from trl.trainer.utils import add_fused_lm_head

from alignflow.models.packed_rows import pack_plan
from alignflow.training import logprob_head
from alignflow.training.logprob_head import EXTRAS, install_label_head, label_logprobs

FIELDS = ("log_probs", *EXTRAS)


def _tiny_lm(**config: object) -> LlamaForCausalLM:
    torch.manual_seed(0)
    settings = dict(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(LlamaConfig(**(settings | config)))
    model.get_output_embeddings().weight.requires_grad_(False)  # a frozen head, as under LoRA
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(0, 300, (3, 16))
    labels = ids.clone()
    labels[:, :6] = -100  # the prompt
    labels[1, 12:] = -100  # padding
    return ids, labels


def _trl_and_ours(temperature: float) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    theirs = _tiny_lm()
    ours = copy.deepcopy(theirs)
    for model in (theirs, ours):
        add_fused_lm_head(model, temperature=temperature, outputs=FIELDS)
    assert install_label_head(ours, temperature, outputs=FIELDS)
    return theirs, ours


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_trls_fused_head(temperature):
    ids, labels = _batch()
    results = []
    for model in _trl_and_ours(temperature):
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        (out.log_probs.sum() + 0.3 * out.entropy.sum()).backward()  # an entropy bonus reaches h too
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((out, grads))
    (theirs, their_grads), (ours, our_grads) = results
    for field in FIELDS:
        ours_field, theirs_field = getattr(ours, field).float(), getattr(theirs, field).float()
        torch.testing.assert_close(ours_field, theirs_field, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, theirs.loss)
    assert torch.equal(ours.label_mask, theirs.label_mask)
    assert our_grads.abs().sum() > 0
    torch.testing.assert_close(our_grads, their_grads, atol=1e-5, rtol=1e-4)


def test_only_the_labelled_positions_are_projected(monkeypatch):
    ids, labels = _batch()
    _, ours = _trl_and_ours(1.0)
    projected = []
    real = logprob_head._chunk_logits
    counted = lambda rows, *rest: projected.append(len(rows)) or real(rows, *rest)  # noqa: E731
    monkeypatch.setattr(logprob_head, "_chunk_logits", counted)
    ours(input_ids=ids, labels=labels, fused_lm_head=True).log_probs.sum().backward()
    assert sum(projected) == int((labels[:, 1:] != -100).sum()) < labels[:, 1:].numel()


def test_no_gradient_work_without_grad_and_an_all_masked_batch_still_backpropagates():
    hidden = torch.randn(5, 32)
    weight = torch.randn(300, 32)
    with torch.no_grad():
        scores = label_logprobs(hidden, weight, torch.randint(0, 300, (5,)))
    assert scores["log_probs"].shape == (5,) and (scores["log_probs"] <= 0).all()
    ids, labels = _batch()
    labels[:] = -100
    _, ours = _trl_and_ours(1.0)
    out = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()  # a differentiable zero, as TRL's head gives
    assert float(out.loss) == 0.0


def test_it_steps_aside_for_a_trainable_head_a_scaled_head_and_fields_it_lacks():
    ids, labels = _batch()
    theirs, ours = _trl_and_ours(1.0)
    ours.get_output_embeddings().weight.requires_grad_(True)  # full fine-tuning: TRL's head trains W
    out = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    out.log_probs.sum().backward()
    assert ours.get_output_embeddings().weight.grad is not None  # TRL's path ran

    softcapped = _tiny_lm(final_logit_softcapping=30.0)
    add_fused_lm_head(softcapped)
    assert not install_label_head(softcapped)
    wpo = _tiny_lm()
    add_fused_lm_head(wpo, outputs=("log_probs", "log_sum_sq_probs"))
    assert not install_label_head(wpo, outputs=("log_probs", "log_sum_sq_probs"))


def test_the_gradient_of_a_confident_token_keeps_its_precision_in_bf16():
    # d logp/dh = W[y] - p @ W nearly cancels when p_y is near 1: formed after a bf16 product
    # it was noise (8% median, 71% worst error on SmolLM2's confident tokens)
    torch.manual_seed(0)
    weight = torch.randn(4000, 64).to(torch.bfloat16)
    labels = torch.randint(0, 4000, (128,))
    hidden = (weight[labels].float() * torch.linspace(0.05, 0.3, 128)[:, None]).to(torch.bfloat16)
    h64, w64 = hidden.double(), weight.double()
    probs = torch.softmax(h64 @ w64.T, -1)
    exact = w64[labels] - probs @ w64
    confident = probs[torch.arange(128), labels] > 0.9
    assert confident.sum() >= 20

    rows = hidden.clone().requires_grad_(True)
    label_logprobs(rows, weight, labels)["log_probs"].sum().backward()
    error = (rows.grad.double() - exact).norm(dim=1) / exact.norm(dim=1)
    # fp32 logits themselves leave a few % on the most confident rows (TRL's head too)
    assert error[confident].median() < 0.01 and error[confident].max() < 0.1


def test_a_frozen_bf16_head_is_converted_to_fp32_once_and_again_after_it_changes():
    torch.manual_seed(0)
    weight = torch.randn(300, 32).to(torch.bfloat16)
    hidden, labels = torch.randn(6, 32).to(torch.bfloat16), torch.randint(0, 300, (6,))
    first = logprob_head._fp32_weight(weight)
    assert logprob_head._fp32_weight(weight) is first  # no second 4-byte copy per forward
    before = label_logprobs(hidden, weight, labels)["log_probs"]

    weight.mul_(2.0)  # an in-place update (a merged adapter, a loaded state dict)
    after = label_logprobs(hidden, weight, labels)["log_probs"]
    expected = torch.log_softmax(hidden.float() @ weight.float().T, -1).gather(1, labels[:, None])[:, 0]
    torch.testing.assert_close(after, expected)
    assert not torch.allclose(after, before)

    weight.data = torch.randn(300, 32).to(torch.bfloat16)  # new storage, same tensor
    torch.testing.assert_close(logprob_head._fp32_weight(weight), weight.float())

    trained = torch.nn.Parameter(weight.clone())  # a head that trains keeps its graph
    assert logprob_head._fp32_weight(trained).grad_fn is not None


def test_the_streamed_pass_over_many_vocabulary_blocks_gives_the_whole_vocabularys_numbers(monkeypatch):
    # blocks of 64 tokens (the last one partial) and passes of 7 rows: every running sum is
    # rescaled as the maximum moves, and labels fall in every block, the last one included
    monkeypatch.setattr(logprob_head, "VOCAB_BLOCK", 64)
    monkeypatch.setattr(logprob_head, "ROWS_PER_PASS", 7)
    torch.manual_seed(0)
    weight = torch.randn(300, 32)
    hidden = torch.randn(40, 32) * torch.linspace(0.1, 3.0, 40)[:, None]  # flat to peaked rows
    labels = torch.randint(0, 300, (40,))
    labels[:5] = torch.tensor([0, 63, 64, 256, 299])  # first, block edges and the last token
    labels[5:10] = (hidden[5:10] @ weight.T).argmax(-1)  # the top token: is_top1 and a confident p

    rows = hidden.clone().requires_grad_(True)
    scores = label_logprobs(rows, weight, labels, temperature=0.7)
    (scores["log_probs"].sum() + 0.3 * scores["entropy"].sum()).backward()

    exact = hidden.double().requires_grad_(True)
    logits = exact @ weight.double().T / 0.7
    log_softmax = torch.log_softmax(logits, -1)
    log_probs = log_softmax.gather(1, labels[:, None])[:, 0]
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    (log_probs.sum() + 0.3 * entropy.sum()).backward()

    torch.testing.assert_close(scores["log_probs"].double(), log_probs.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores["entropy"].double(), entropy.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores["mean_logits"].double(), logits.mean(-1).detach(), atol=1e-5, rtol=1e-5)
    assert torch.equal(scores["is_top1"], logits.argmax(-1) == labels) and scores["is_top1"][5:10].all()
    torch.testing.assert_close(rows.grad.double(), exact.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_bf16_models_very_confident_rows_keep_fp32_numbers(temperature):
    # logits spread over hundreds: most of the vocabulary sits far below e^-87 of the top, where
    # the head floors the exponent (torch's exp is slow there); bf16 rows and head take the bf16
    # math product where this CPU has it. Neither may move a number beyond fp32's own error.
    torch.manual_seed(0)
    weight = torch.randn(300, 32).bfloat16()
    hidden = (torch.randn(24, 32) * torch.linspace(1.0, 40.0, 24)[:, None]).bfloat16()
    labels = torch.randint(0, 300, (24,))
    labels[:6] = (hidden[:6].float() @ weight.float().T).argmax(-1)  # p near one: 1 - p is tiny

    rows = hidden.clone().requires_grad_(True)
    scores = label_logprobs(rows, weight, labels, temperature=temperature)
    (scores["log_probs"].sum() + 0.3 * scores["entropy"].sum()).backward()

    exact = hidden.double().requires_grad_(True)
    logits = exact @ weight.double().T / temperature
    assert (logits.max(-1).values - logits.min(-1).values).max() > 300  # far past the floor
    log_softmax = torch.log_softmax(logits, -1)
    log_probs = log_softmax.gather(1, labels[:, None])[:, 0]
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    (log_probs.sum() + 0.3 * entropy.sum()).backward()

    scale = logits.abs().max(-1).values.detach()  # fp32 logits carry a relative error
    assert ((scores["log_probs"].double() - log_probs.detach()).abs() <= 1e-6 * scale + 1e-5).all()
    assert ((scores["entropy"].double() - entropy.detach()).abs() <= 1e-6 * scale + 1e-5).all()
    torch.testing.assert_close(
        rows.grad.double(), exact.grad.to(torch.bfloat16).double(), atol=2e-2, rtol=2e-2
    )


def test_a_padded_batch_scored_over_packed_rows_matches_trls_fused_head():
    """Rows of 5 to 16 tokens (DPO's chosen and rejected answers): the head's body runs over
    packed rows (alignflow.models.packed_rows), with TRL's numbers and gradients all the same."""
    torch.manual_seed(2)
    ids = torch.randint(1, 300, (4, 16))
    mask = torch.ones(4, 16, dtype=torch.long)
    for row, length in enumerate((16, 5, 9, 7)):
        mask[row, length:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :3] = -100
    # [16], [9, 7], [5] (at rows of 16: where attention costs twice the weights' products)
    assert pack_plan(mask, attention_share=1 / 8).packed_rows == 3
    results = []
    for model in _trl_and_ours(1.0):
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        out.log_probs.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((out, grads))
    (theirs, their_grads), (ours, our_grads) = results
    scored = labels[:, 1:] != -100
    torch.testing.assert_close(ours.log_probs[scored], theirs.log_probs[scored], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(our_grads, their_grads, atol=1e-5, rtol=1e-4)


def test_counts_reach_the_stage_when_a_compiled_copy_runs_the_model():
    """``torch_compile: true`` runs accelerate's regional compilation: copies of the modules on
    the way to the decoder layers do the forwards. The label head's and the packing's counts
    must still be the model's (the stage tags said "off" where both ran)."""
    from accelerate.utils import compile_regions

    from alignflow.models.packed_rows import packing_counts

    _, ours = _trl_and_ours(1.0)
    ids, labels = _batch()
    mask = (labels != -100) | (torch.arange(16) < 6)  # row 1 padded after 12 tokens
    compiled = compile_regions(ours, backend="eager", dynamic=True)
    assert compiled is not ours and compiled.model is not ours.model
    compiled(input_ids=ids, attention_mask=mask.long(), labels=labels, fused_lm_head=True)
    assert ours.label_head_counter.calls == 1
    counts = packing_counts(ours.model)
    assert counts.forwards == 1 and counts.tokens == int(mask.sum())
