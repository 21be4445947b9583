"""The outside judge: fitted once on pairs no run trains on, refused where it is not outside
(it saw a pinned prompt, or its encoder is not the installed one), reported beside the run's
reward model, and never counted by promotion."""

from __future__ import annotations

import json

import pytest

from alignflow.config import load_config
from alignflow.data.halves import HALF_OF, prompt_half
from alignflow.data.split import assign_split
from alignflow.evaluation.benchmark import read_benchmark
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.embedding_judge import (
    JudgeArtefact,
    OutsideJudgeError,
    fit_judge,
    judge_line,
    last_user_turn,
    load_outside_judge,
    seen_prompts,
)
from alignflow.evaluation.evaluate import evaluate_on_golden
from alignflow.promotion.gates import trusted_judges
from alignflow.promotion.promotion_config import PromotionConfig
from tests.conftest import HH_RLHF_TEST, REPO_ROOT

CONFIGS_NAMING_IT = sorted(
    p.name for p in (REPO_ROOT / "configs").glob("*.yaml") if "outside_judge:" in p.read_text()
)
TOPICS = [
    "my neighbour's dog", "the weather tomorrow", "a birthday present", "learning the guitar",
    "a job interview", "cooking rice", "a broken bicycle", "saving money", "a school project",
    "moving house", "a noisy flat", "running a marathon", "planting tomatoes", "a lost wallet",
    "writing a poem", "fixing a leaky tap", "a long flight", "a first date", "painting a room",
    "learning French", "a sore back", "a chess opening", "baking bread", "a camping trip",
    "a late train", "a rude colleague", "a cold that won't go", "a wedding speech",
    "a scary film", "a new laptop", "a tidy desk", "a houseplant dying", "a quiz night",
]  # fmt: skip
KIND = [
    "I'm glad you asked. Here is a careful, friendly suggestion that should help with {t}.",
    "Happy to help with {t}: start small, be patient, and ask someone you trust if unsure.",
]
UNKIND = [
    "Who cares about {t}? Figure it out yourself, idiot.",
    "That's a stupid question about {t}. Shut up and stop wasting my time.",
]


def prompt(topic: str, turn: int = 0) -> str:
    return f"\n\nHuman: Can you help me with {topic}? (question {turn})\n\nAssistant:"


def pairs(topics, turn: int) -> list[dict]:
    return [
        {"prompt": prompt(t, turn), "chosen": KIND[i % 2].format(t=t), "rejected": UNKIND[i % 2].format(t=t)}
        for i, t in enumerate(topics)
    ]


@pytest.fixture(scope="module")
def artefact(tmp_path_factory):
    fitted = fit_judge(pairs(TOPICS[:24], turn=1), {"source": "kind-vs-unkind test pairs"})
    return fitted, fitted.save(tmp_path_factory.mktemp("judge") / "judge.json")


def test_the_last_user_turn_is_what_the_answer_is_judged_against():
    transcript = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: and now?\n\nAssistant:"
    assert last_user_turn(transcript) == "and now?"
    assert last_user_turn([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == "a"
    assert last_user_turn("no markers at all ") == "no markers at all"


def test_fitted_on_pairs_it_ranks_unseen_pairs_and_records_what_it_saw(artefact):
    fitted, path = artefact
    assert fitted.trained_on == {"source": "kind-vs-unkind test pairs", "pairs": 24}
    assert len(fitted.prompt_hashes) == 24 and len(fitted.weights) == 384
    assert fitted.fit["cv_pair_accuracy"] > 0.5, fitted.fit
    judge = load_outside_judge(path, [prompt(t, turn=2) for t in TOPICS[24:]])
    unseen = pairs(TOPICS[24:], turn=2)
    verdicts = judge.compare(
        [p["prompt"] for p in unseen], [p["chosen"] for p in unseen], [p["rejected"] for p in unseen]
    )
    assert sum(v == 1.0 for v in verdicts) / len(verdicts) > 0.8, verdicts


def test_a_pinned_set_sharing_a_prompt_with_its_training_pairs_is_refused(artefact):
    _, path = artefact
    pinned = [prompt(t, turn=2) for t in TOPICS[24:]] + [prompt(TOPICS[3], turn=1)]
    with pytest.raises(OutsideJudgeError, match=r"prompt_hashes.*1 of the 10 pinned prompts"):
        load_outside_judge(path, pinned)


def test_a_head_fitted_on_another_encoder_or_a_broken_file_is_refused(artefact, tmp_path):
    fitted, path = artefact
    other = json.loads(path.read_text())
    other["encoder_sha256"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(OutsideJudgeError, match="encoder_sha256"):
        load_outside_judge(tmp_path / "other.json", [])
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(OutsideJudgeError, match="broken.json: not JSON"):
        JudgeArtefact.load(tmp_path / "broken.json")
    (tmp_path / "wrong.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(OutsideJudgeError, match="field 'format'"):
        JudgeArtefact.load(tmp_path / "wrong.json")
    with pytest.raises(OutsideJudgeError, match="no such judge artefact"):
        load_outside_judge(tmp_path / "missing.json", [])


@pytest.mark.skipif(not HH_RLHF_TEST.exists(), reason=f"{HH_RLHF_TEST} is missing (the shared data)")
@pytest.mark.parametrize("config_file", CONFIGS_NAMING_IT)
def test_the_built_in_judge_never_saw_a_prompt_its_configs_pin_nor_the_reward_models_half(config_file):
    cfg = load_config(REPO_ROOT / "configs" / config_file)
    judge = load_outside_judge(cfg.evaluation.outside_judge, [])
    records = read_benchmark(HH_RLHF_TEST, cfg.data).pairs()
    eval_prompts = [
        r["prompt"] for r in records if assign_split(r["prompt"], cfg.data.eval_fraction, cfg.seed) == "eval"
    ]
    train_prompts = [
        r["prompt"] for r in records if assign_split(r["prompt"], cfg.data.eval_fraction, cfg.seed) == "train"
    ]
    assert eval_prompts and load_outside_judge(cfg.evaluation.outside_judge, eval_prompts), (
        "loads: no overlap"
    )
    reward_half = [p for p in train_prompts if prompt_half(p) == HALF_OF["reward"]]
    assert seen_prompts(judge.artefact, reward_half) == 0, "the run's reward model's half"
    assert seen_prompts(judge.artefact, train_prompts) == len(judge.artefact.prompt_hashes) > 800
    assert judge.artefact.fit["cv_pair_accuracy"] > 0.55


def test_evaluation_reports_it_beside_the_reward_model_and_promotion_never_counts_it(artefact):
    _, path = artefact
    held_out = TOPICS[24:]
    golden = [{**p, "kind": "pair", "metadata": {}} for p in pairs(held_out, turn=3)]
    answers = {
        "policy": [KIND[0].format(t=t) for t in held_out],
        "ref": [UNKIND[0].format(t=t) for t in held_out],
    }

    def complete(model, tokenizer, prompts):
        return answers[model][: len(prompts)]

    def contrary(prompts, completions):  # a reward model that prefers rudeness
        return [float("idiot" in c or "stupid" in c) for c in completions]

    config = EvaluationConfig(outside_judge=str(path), kl_samples=0, max_prompts=len(held_out))
    report = evaluate_on_golden(golden, ("policy", None), "ref", contrary, config=config, complete=complete)
    metrics = report.gate_metrics()
    assert metrics["golden/outside/win_rate_vs_reference"] > 0.8
    assert metrics["golden/reward/win_rate_vs_reference"] < 0.2
    assert metrics["golden/outside/pair_accuracy"] > 0.8 and metrics["golden/outside/pair_accuracy/n"] == 9
    assert metrics["golden/outside/agreement_with_reward"] < 0.2, "the two judges rank the pairs oppositely"
    line = judge_line(metrics, "outside")
    assert line is not None and "win rate vs reference" in line and "never decides" in line
    reward_page = judge_line(metrics, "outside", win_rates=False)  # a reward model's version page
    assert reward_page is not None and "win rate" not in reward_page and "pinned-pair accuracy" in reward_page
    allowing = PromotionConfig(allow_unaudited_judges=True)
    assert "outside" not in trusted_judges(metrics, own_reward_trusted=False, config=allowing)
    without = evaluate_on_golden(
        golden, ("policy", None), "ref", contrary, config=config.model_copy(update={"outside_judge": None}),
        complete=complete,
    )  # fmt: skip
    assert not any(key.startswith("golden/outside/") for key in without.metrics)
