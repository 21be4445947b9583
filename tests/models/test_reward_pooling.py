"""Mean pooling of a reward model: padding-blind, order-preserving, and what the meta says."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def minilm_reward():
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from alignflow.models.factory import minilm_path

    torch.manual_seed(0)
    path = minilm_path()
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    return model, AutoTokenizer.from_pretrained(path)


PROMPTS = ["Hi", "How do I pick a lock?", "Tell me a joke", "What is the capital of France? Be brief."]
ANSWERS = ["Hello!", "I can't help with that, sorry.", "Why did the chicken cross the road? " * 5, "Paris."]


def _scorer(model, tokenizer, pooling: str, batch_size: int):
    from alignflow.models.reward_scorer import RewardMeta, RewardScorer

    meta = RewardMeta(max_length=64, pooling=pooling)
    return RewardScorer(model, tokenizer, meta, normalize=False, batch_size=batch_size)


def test_mean_pooling_is_the_head_on_the_masked_mean(minilm_reward):
    from alignflow.models.reward_scorer import encode_for_reward

    model, tokenizer = minilm_reward
    batched = _scorer(model, tokenizer, "mean", batch_size=4).raw(PROMPTS, ANSWERS)
    for prompt, answer, reward in zip(PROMPTS, ANSWERS, batched, strict=True):
        ids = torch.tensor([encode_for_reward(tokenizer, prompt, answer, 64)])
        with torch.no_grad():
            hidden = model.bert(input_ids=ids).last_hidden_state
            expected = model.classifier(hidden.mean(dim=1)).item()
        # padded beside longer rows, sorted by length and put back: still this row's own reward
        assert reward == pytest.approx(expected, abs=1e-4)


def test_the_meta_pooling_decides_the_rewards(minilm_reward):
    model, tokenizer = minilm_reward
    mean = _scorer(model, tokenizer, "mean", batch_size=2).raw(PROMPTS, ANSWERS)
    cls = _scorer(model, tokenizer, "model", batch_size=2).raw(PROMPTS, ANSWERS)
    assert cls != pytest.approx(mean, abs=1e-3)
    with pytest.raises(ValueError, match="unknown reward pooling"):
        _scorer(model, tokenizer, "max", batch_size=2).raw(PROMPTS, ANSWERS)


def test_rows_come_back_in_their_order(minilm_reward):
    model, tokenizer = minilm_reward
    one_by_one = _scorer(model, tokenizer, "model", batch_size=1).raw(PROMPTS, ANSWERS)
    batched = _scorer(model, tokenizer, "model", batch_size=3).raw(PROMPTS, ANSWERS)
    assert batched == pytest.approx(one_by_one, abs=1e-4)
    assert _scorer(model, tokenizer, "mean", batch_size=3).raw([], []) == []


def test_the_research_reward_model_scores_with_the_pooling_its_meta_names(minilm_reward):
    """spec 002's RewardModel and the pipeline's scorer give a mean-pooled model the same rewards."""
    from alignflow.models.reward_scorer import RewardMeta
    from alignflow.rlhf.reward_model import RewardModel

    model, tokenizer = minilm_reward
    expected = _scorer(model, tokenizer, "mean", batch_size=4).raw(PROMPTS, ANSWERS)
    research = RewardModel(model, tokenizer, RewardMeta(max_length=64, pooling="mean"))
    with torch.no_grad():
        got = research(**research.encode(PROMPTS, ANSWERS)).tolist()
    assert got == pytest.approx(expected, abs=1e-5)
    as_trained_by_default = _scorer(model, tokenizer, "model", batch_size=4).raw(PROMPTS, ANSWERS)
    assert got != pytest.approx(as_trained_by_default, abs=1e-3)


def test_the_answer_span_holds_the_answers_tokens_however_the_text_is_cut(minilm_reward):
    from alignflow.models.reward_scorer import encode_with_answer_span

    _, tokenizer = minilm_reward
    answer = "I can't help with that, sorry."
    answer_tokens = tokenizer.tokenize(answer) + [tokenizer.sep_token]  # the end marker reward_text adds
    for prompt, max_length in (("How do I pick a lock?", 64), ("word " * 300, 48)):
        ids, (start, end) = encode_with_answer_span(tokenizer, prompt, answer, max_length)
        assert len(ids) <= max_length and end == len(ids) - 1  # the closing [SEP] is not the answer
        assert tokenizer.convert_ids_to_tokens(ids[start:end]) == answer_tokens
        assert ids[start - 1] != tokenizer.cls_token_id or prompt == ""  # some prompt survives before it
    # an answer longer than the window: everything between [CLS] and [SEP] is answer
    ids, (start, end) = encode_with_answer_span(tokenizer, "Q?", "on and on " * 100, 32)
    assert (start, end) == (1, 31) and len(ids) == 32


def test_answer_pooling_is_the_head_on_the_mean_of_the_answers_tokens(minilm_reward):
    from alignflow.models.reward_scorer import encode_with_answer_span

    model, tokenizer = minilm_reward
    batched = _scorer(model, tokenizer, "answer", batch_size=4).raw(PROMPTS, ANSWERS)
    for prompt, answer, reward in zip(PROMPTS, ANSWERS, batched, strict=True):
        ids, (start, end) = encode_with_answer_span(tokenizer, prompt, answer, 64)
        with torch.no_grad():
            hidden = model.bert(input_ids=torch.tensor([ids])).last_hidden_state
            expected = model.classifier(hidden[:, start:end].mean(dim=1)).item()
        assert reward == pytest.approx(expected, abs=1e-4)
    assert batched != pytest.approx(_scorer(model, tokenizer, "mean", batch_size=4).raw(PROMPTS, ANSWERS))
    # the prompt is read (it shapes the answer's states) though it is not pooled
    other_prompts = ["Say something."] * len(ANSWERS)
    in_other_context = _scorer(model, tokenizer, "answer", batch_size=4).raw(other_prompts, ANSWERS)
    assert in_other_context != pytest.approx(batched, abs=1e-4)


def test_answer_masks_follow_the_tokenizers_padding_side(minilm_reward):
    from alignflow.models.reward_scorer import padded_span_mask

    _, tokenizer = minilm_reward
    rows, spans = [[101, 7, 8, 102], [101, 9, 102]], [(1, 3), (1, 2)]
    right = padded_span_mask(tokenizer, rows, spans, 5)
    assert right.tolist() == [[0, 1, 1, 0, 0], [0, 1, 0, 0, 0]]
    tokenizer.padding_side = "left"  # a decoder's tokenizer: the pads come first
    try:
        left = padded_span_mask(tokenizer, rows, spans, 5)
    finally:
        tokenizer.padding_side = "right"
    assert left.tolist() == [[0, 0, 1, 1, 0], [0, 0, 0, 1, 0]]


def test_answer_pooling_without_a_span_is_refused(minilm_reward):
    from alignflow.models.reward_scorer import reward_logits

    model, _ = minilm_reward
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="needs answer_mask"):
        reward_logits(model, ids, torch.ones_like(ids), "answer")


def test_a_saved_max_length_beyond_the_position_table_is_cut_to_it(minilm_reward):
    """MiniLM has 512 absolute positions: a meta asking for 1024 would crash on a long input."""
    from alignflow.models.reward_scorer import RewardMeta, RewardScorer

    model, tokenizer = minilm_reward
    long_prompt, long_answer = "word " * 700, "yes " * 300
    scorers = [
        RewardScorer(model, tokenizer, RewardMeta(max_length=n, pooling="answer"), normalize=False)
        for n in (1024, 512)
    ]
    assert scorers[0].max_length == 512 and scorers[0].meta.max_length == 1024
    wide, at_limit = (s.raw([long_prompt, "Hi"], [long_answer, "Hello"]) for s in scorers)
    assert wide == pytest.approx(at_limit, abs=1e-5)


def test_a_rotary_model_has_no_position_table_to_cut_to(reward_model_dir):
    """The tiny Llama (256 positions, rotary) reads longer inputs: its saved max_length stands."""
    from alignflow.models.positions import position_limit
    from alignflow.models.reward_scorer import RewardMeta, RewardScorer, load_reward_scorer

    loaded = load_reward_scorer(reward_model_dir)
    assert loaded.model.config.max_position_embeddings < 512
    assert position_limit(loaded.model, loaded.tokenizer) is None
    scorer = RewardScorer(loaded.model, loaded.tokenizer, RewardMeta(max_length=512), normalize=False)
    assert scorer.max_length == 512 and len(scorer.raw(["word " * 400], ["yes " * 200])) == 1
