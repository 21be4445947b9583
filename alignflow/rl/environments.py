"""Text environments for RL on language models: a prompt goes in, generated tokens come back scored.

An episode starts at ``reset()`` with one prompt and ends when the generated text hits a
stop sequence, the tokenizer's end-of-sequence token or ``max_length`` tokens. Rewards are
plain Python callables, so the same environment drives PPO, GRPO-style sampling or a
hand-written loop. Trainers that generate a whole batch at once use :meth:`evaluate`, which
scores a complete response from a given observation without touching the episode state.

Built-in environments reuse the demo task (addition with a required answer format) and a
code task whose syntax is checked with :func:`ast.parse` only: generated code is never run.
"""

from __future__ import annotations

import ast
import math
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from alignflow.data import demo
from alignflow.data.answers import correctness_reward, format_reward

RewardFn = Callable[[str, str, str], float]


@dataclass
class Observation:
    """What a policy sees: the token ids of prompt (+ text so far) and the prompt itself."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """The outcome of one ``step``: reward, whether the episode ended, and what was observed."""

    reward: float
    done: bool
    next_observation: Observation | None
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(init=False)
class Trajectory:
    """One finished (or truncated) episode, as collected by a rollout.

    Both spec spellings of the per-action log-probs are accepted (``log_probs`` or
    ``logprobs``); ``total_reward`` defaults to the sum of ``rewards`` when not given.
    """

    observations: list[Observation]
    actions: list[torch.Tensor]
    rewards: list[float]
    log_probs: list[torch.Tensor] | None
    values: list[torch.Tensor] | None
    done: bool
    total_reward: float
    metrics: dict[str, Any]

    def __init__(
        self,
        observations: list[Observation],
        actions: list[torch.Tensor],
        rewards: list[float],
        log_probs: list[torch.Tensor] | None = None,
        values: list[torch.Tensor] | None = None,
        done: bool = False,
        total_reward: float | None = None,
        metrics: dict[str, Any] | None = None,
        logprobs: list[torch.Tensor] | None = None,
    ):
        if log_probs is not None and logprobs is not None:
            raise TypeError("Trajectory: give log_probs or logprobs (the same thing), not both")
        self.observations, self.actions, self.rewards = observations, actions, rewards
        self.log_probs = log_probs if log_probs is not None else logprobs
        self.values, self.done = values, done
        self.total_reward = float(sum(rewards)) if total_reward is None else float(total_reward)
        self.metrics = dict(metrics or {})

    @property
    def logprobs(self) -> list[torch.Tensor] | None:
        """The second spec document's name for ``log_probs``."""
        return self.log_probs

    def __len__(self) -> int:
        return len(self.actions)


class RLEnvironment(ABC):
    """The interface every environment keeps: ``reset``, ``step`` and ``render``."""

    @abstractmethod
    def reset(self) -> Observation: ...

    @abstractmethod
    def step(self, action: torch.Tensor | int | Sequence[int]) -> StepResult: ...

    @abstractmethod
    def render(self) -> str: ...


def _as_token_list(action: torch.Tensor | int | Sequence[int]) -> list[int]:
    if isinstance(action, torch.Tensor):
        return [int(t) for t in action.reshape(-1).tolist()]
    if isinstance(action, int):
        return [action]
    return [int(t) for t in action]


def _check_prompts(prompts: Sequence[str]) -> list[str]:
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: an environment needs at least one prompt")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"prompts[{i}]: expected a non-empty string, got {prompt!r}")
    return prompts


def length_reward(prompt: str, generated: str, full_text: str) -> float:
    """Default reward: more words score higher, saturating at 1.0 after 50 words."""
    return min(len(generated.split()) / 50.0, 1.0)


@dataclass
class _Episode:
    prompt: str
    prompt_ids: list[int]
    metadata: dict[str, Any]
    generated_ids: list[int] = field(default_factory=list)
    done: bool = False
    stop_reason: str | None = None


class TextGenerationEnv(RLEnvironment):
    """Generate text from prompts; the reward arrives when the episode ends.

    ``step`` takes one token or several. Tokens are consumed one at a time so that a stop
    sequence ends the episode exactly where it appears; ``info["consumed"]`` tells a batch
    trainer how many of the given tokens belong to the episode (the rest must be masked).
    """

    def __init__(
        self,
        tokenizer,
        prompts: Sequence[str],
        max_length: int = 512,
        reward_fn: RewardFn | None = None,
        stop_sequences: Sequence[str] | None = None,
        temperature: float = 1.0,
        prompt_metadata: Sequence[Mapping[str, Any]] | None = None,
        shuffle: bool = False,
        seed: int = 0,
    ):
        self.tokenizer = tokenizer
        self.prompts = _check_prompts(prompts)
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if prompt_metadata is not None and len(prompt_metadata) != len(self.prompts):
            raise ValueError(
                f"prompt_metadata has {len(prompt_metadata)} entries for {len(self.prompts)} prompts"
            )
        self.max_length = max_length
        self.reward_fn = reward_fn or length_reward
        self.stop_sequences = [s for s in (stop_sequences or []) if s]
        self.temperature = temperature
        self.prompt_metadata = [dict(m) for m in prompt_metadata] if prompt_metadata else None
        self.shuffle = shuffle
        self._rng = random.Random(seed)
        self._order: list[int] = []
        self._episode: _Episode | None = None

    # ---- prompt selection -------------------------------------------------------------
    def _next_index(self) -> int:
        if not self._order:
            self._order = list(range(len(self.prompts)))
            if self.shuffle:
                self._rng.shuffle(self._order)
            self._order.reverse()  # pop() from the end keeps the intended order
        return self._order.pop()

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _observation(self, episode: _Episode) -> Observation:
        ids = torch.tensor(episode.prompt_ids + episode.generated_ids, dtype=torch.long)
        return Observation(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            prompt=episode.prompt,
            metadata=episode.metadata,
        )

    def reset(self) -> Observation:
        """Start an episode on the next prompt (in order, or shuffled when ``shuffle``)."""
        index = self._next_index()
        prompt = self.prompts[index]
        metadata = dict(self.prompt_metadata[index]) if self.prompt_metadata else {}
        metadata["prompt_index"] = index
        self._episode = _Episode(prompt=prompt, prompt_ids=self._encode(prompt), metadata=metadata)
        return self._observation(self._episode)

    # ---- scoring ----------------------------------------------------------------------
    def compute_reward(self, prompt: str, generated: str, full_text: str) -> tuple[float, dict[str, float]]:
        """Total reward and the metrics reported beside it."""
        reward = float(self.reward_fn(prompt, generated, full_text))
        return reward, {"reward": reward}

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_in(self, text: str) -> int | None:
        """End of the earliest stop sequence in ``text``, or None."""
        ends = [text.find(s) + len(s) for s in self.stop_sequences if s in text]
        return min(ends) if ends else None

    def _advance(self, episode: _Episode, tokens: list[int]) -> int:
        """Append tokens until the episode ends; return how many were consumed."""
        eos = self.tokenizer.eos_token_id
        consumed = 0
        for token in tokens:
            if episode.done:
                break
            episode.generated_ids.append(token)
            consumed += 1
            if eos is not None and token == eos:
                episode.done, episode.stop_reason = True, "eos"
            elif self.stop_sequences and self._stop_in(self._decode(episode.generated_ids)) is not None:
                episode.done, episode.stop_reason = True, "stop_sequence"
            elif len(episode.prompt_ids) + len(episode.generated_ids) >= self.max_length:
                episode.done, episode.stop_reason = True, "max_length"
        return consumed

    def _generated_text(self, episode: _Episode) -> str:
        text = self._decode(episode.generated_ids)
        cut = self._stop_in(text) if self.stop_sequences else None
        return text if cut is None else text[:cut]

    def _result(self, episode: _Episode, consumed: int) -> StepResult:
        generated = self._generated_text(episode)
        info = {"consumed": consumed, "generated": generated, "stop_reason": episode.stop_reason}
        if not episode.done:
            return StepResult(0.0, False, self._observation(episode), info=info)
        full_text = episode.prompt + generated
        reward, metrics = self.compute_reward(episode.prompt, generated, full_text)
        if not math.isfinite(reward):
            raise ValueError(f"reward for prompt {episode.prompt!r} is not finite: {reward}")
        return StepResult(reward, True, self._observation(episode), info=info, metrics=metrics)

    def step(self, action: torch.Tensor | int | Sequence[int]) -> StepResult:
        """Append the action's token(s); the reward is non-zero only when the episode ends."""
        if self._episode is None:
            raise RuntimeError("step() before reset(): start an episode first")
        if self._episode.done:
            raise RuntimeError("step() after the episode ended: call reset()")
        consumed = self._advance(self._episode, _as_token_list(action))
        return self._result(self._episode, consumed)

    def finish(self) -> StepResult:
        """End the current episode where it is (e.g. a generation budget ran out) and score it."""
        if self._episode is None:
            raise RuntimeError("finish() before reset()")
        if not self._episode.done:
            self._episode.done, self._episode.stop_reason = True, "truncated"
        return self._result(self._episode, 0)

    def evaluate(self, observation: Observation, action: torch.Tensor | Sequence[int]) -> StepResult:
        """Score a whole response from ``observation`` without changing the current episode.

        A response that neither stops nor reaches ``max_length`` is scored as truncated.
        """
        prompt_ids = self._encode(observation.prompt)
        episode = _Episode(observation.prompt, prompt_ids, dict(observation.metadata))
        consumed = self._advance(episode, _as_token_list(action))
        if not episode.done:
            episode.done, episode.stop_reason = True, "truncated"
        return self._result(episode, consumed)

    def sample_action(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample the next token from last-position ``logits`` at this environment's temperature."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def render(self) -> str:
        if self._episode is None:
            return "<no episode: call reset()>"
        status = f"done ({self._episode.stop_reason})" if self._episode.done else "running"
        return (
            f"[prompt] {self._episode.prompt}\n[generated] {self._generated_text(self._episode)}\n"
            f"[status] {status}, {len(self._episode.generated_ids)} tokens"
        )


class MultiObjectiveRewardEnv(TextGenerationEnv):
    """A text environment whose reward is a weighted sum of named components.

    Every component's raw score is reported in ``StepResult.metrics`` as
    ``reward_<name>``, so a run can show which objective moved.
    """

    def __init__(
        self,
        tokenizer,
        prompts: Sequence[str],
        reward_components: Mapping[str, RewardFn],
        reward_weights: Mapping[str, float] | None = None,
        **kwargs,
    ):
        if not reward_components:
            raise ValueError("reward_components: give at least one named reward function")
        weights = dict(reward_weights or {})
        unknown = sorted(set(weights) - set(reward_components))
        if unknown:
            raise ValueError(
                f"reward_weights names unknown components {unknown}; known: {sorted(reward_components)}"
            )
        self.reward_components = dict(reward_components)
        self.reward_weights = {name: float(weights.get(name, 1.0)) for name in self.reward_components}
        super().__init__(tokenizer, prompts, **kwargs)

    def compute_multi_objective_reward(
        self, prompt: str, generated: str, full_text: str
    ) -> tuple[float, dict[str, float]]:
        """The weighted total and each component's unweighted score."""
        scores = {
            name: float(fn(prompt, generated, full_text)) for name, fn in self.reward_components.items()
        }
        total = sum(self.reward_weights[name] * score for name, score in scores.items())
        return total, scores

    def compute_reward(self, prompt: str, generated: str, full_text: str) -> tuple[float, dict[str, float]]:
        total, scores = self.compute_multi_objective_reward(prompt, generated, full_text)
        metrics = {f"reward_{name}": score for name, score in scores.items()}
        metrics["reward"] = total
        return total, metrics


def _score_texts(
    preference_model: torch.nn.Module, tokenizer, texts: list[str], max_length: int
) -> list[float]:
    """Scalar scores from a preference/reward model, whichever common interface it offers."""
    if hasattr(preference_model, "predict_rewards"):
        # a method of the model's class; nn.Module types unknown attributes as Tensor | Module
        rewards = cast(Any, preference_model).predict_rewards(texts, tokenizer, max_length=max_length)
        return [float(r) for r in rewards]
    enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    device = next(preference_model.parameters()).device
    with torch.no_grad():
        out = preference_model(
            input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device)
        )
    if isinstance(out, Mapping):
        out = out.get("rewards", out.get("logits"))
    elif hasattr(out, "logits"):
        out = out.logits
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"preference_model returned {type(out).__name__}; expected a tensor, logits or 'rewards'"
        )
    return [float(v) for v in out.reshape(len(texts), -1)[:, 0]]


class PreferenceComparisonEnv(RLEnvironment):
    """Collect two responses per prompt and judge which is better.

    The first ``step`` records response A (reward 0, not done); the second records B and
    ends the episode with reward = P(A preferred over B). The judge is a preference model
    (Bradley-Terry on its scores) or a human-feedback callback
    ``fn(prompt, response_a, response_b) -> P(A better)`` in [0, 1]. Judged pairs are kept
    in ``comparisons`` as preference records (prompt/chosen/rejected) for DPO or reward
    model training. With neither judge, the pair is kept unjudged in ``pending`` (for human
    labelling, e.g. through the feedback service) and the episode's reward is 0.5: no
    preference is known yet.
    """

    UNJUDGED = 0.5

    def __init__(
        self,
        tokenizer,
        prompts: Sequence[str],
        preference_model: torch.nn.Module | None = None,
        human_feedback_fn: Callable[[str, str, str], float] | None = None,
        max_length: int = 512,
    ):
        self.tokenizer = tokenizer
        self.prompts = _check_prompts(prompts)
        self.preference_model = preference_model
        self.human_feedback_fn = human_feedback_fn
        self.max_length = max_length
        self.comparisons: list[dict[str, Any]] = []
        self.pending: list[dict[str, str]] = []
        self._index = -1
        self._prompt: str | None = None
        self._responses: list[str] = []

    def reset(self) -> Observation:
        self._index = (self._index + 1) % len(self.prompts)
        self._prompt = self.prompts[self._index]
        self._responses = []
        ids = torch.tensor(
            self.tokenizer(self._prompt, add_special_tokens=False)["input_ids"], dtype=torch.long
        )
        return Observation(ids, torch.ones_like(ids), self._prompt, {"prompt_index": self._index})

    def _judge(self, prompt: str, a: str, b: str) -> tuple[float, dict[str, float]]:
        if self.human_feedback_fn is not None:
            p = float(self.human_feedback_fn(prompt, a, b))
            if not 0.0 <= p <= 1.0:
                raise ValueError(
                    f"human_feedback_fn returned {p} for prompt {prompt!r}; expected P(A better) in [0, 1]"
                )
            return p, {}
        assert self.preference_model is not None  # step() judges only when one of the two is set
        score_a, score_b = _score_texts(
            self.preference_model, self.tokenizer, [prompt + a, prompt + b], self.max_length
        )
        p = 1.0 / (1.0 + math.exp(-(score_a - score_b)))
        return p, {"score_a": score_a, "score_b": score_b}

    def step(self, action: torch.Tensor | int | Sequence[int] | str) -> StepResult:
        if self._prompt is None:
            raise RuntimeError("step() before reset(): start an episode first")
        if len(self._responses) >= 2:
            raise RuntimeError("both responses were already given: call reset()")
        text = (
            action
            if isinstance(action, str)
            else self.tokenizer.decode(_as_token_list(action), skip_special_tokens=True)
        )
        self._responses.append(text)
        obs = Observation(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), self._prompt)
        if len(self._responses) == 1:
            return StepResult(0.0, False, obs, info={"awaiting": "response_b"})
        a, b = self._responses
        if self.preference_model is None and self.human_feedback_fn is None:
            self.pending.append({"prompt": self._prompt, "response_a": a, "response_b": b})
            info = {"response_a": a, "response_b": b, "preferred": None}
            return StepResult(self.UNJUDGED, True, obs, info=info, metrics={"judged": 0.0})
        p, scores = self._judge(self._prompt, a, b)
        chosen, rejected = (a, b) if p >= 0.5 else (b, a)
        self.comparisons.append(
            {"prompt": self._prompt, "chosen": chosen, "rejected": rejected, "margin": abs(2 * p - 1)}
        )
        info = {"response_a": a, "response_b": b, "preferred": "a" if p >= 0.5 else "b"}
        return StepResult(p, True, obs, info=info, metrics={"preference_a": p, **scores})

    def render(self) -> str:
        if self._prompt is None:
            return "<no episode: call reset()>"
        lines = [f"[prompt] {self._prompt}"]
        lines += [f"[response {'ab'[i]}] {r}" for i, r in enumerate(self._responses)]
        return "\n".join(lines)


# ---- built-in environments ------------------------------------------------------------


def create_math_problem_env(
    tokenizer,
    num_problems: int = 200,
    seed: int = 0,
    max_operand: int = 9,
    reward_weights: Mapping[str, float] | None = None,
    max_length: int = 64,
    **kwargs,
) -> MultiObjectiveRewardEnv:
    """The demo addition task as an environment: correctness (weight 1.0) + formatting (0.5).

    The reference answer travels in each observation's metadata and is looked up by prompt,
    so rewards stay exact for any tokenizer.
    """
    problems = list(demo.iter_demo_prompts(num_problems, seed=seed, max_operand=max_operand))
    answers = {p["prompt"]: p["metadata"]["answer"] for p in problems}

    def correctness(prompt: str, generated: str, full_text: str) -> float:
        return correctness_reward(generated, answers[prompt])

    def formatting(prompt: str, generated: str, full_text: str) -> float:
        return format_reward(generated)

    return MultiObjectiveRewardEnv(
        tokenizer,
        [p["prompt"] for p in problems],
        reward_components={"correctness": correctness, "formatting": formatting},
        reward_weights=reward_weights or {"correctness": 1.0, "formatting": 0.5},
        prompt_metadata=[p["metadata"] for p in problems],
        max_length=max_length,
        **kwargs,
    )


DEFAULT_CODE_PROMPTS = [
    "Write a Python function that returns the sum of a list of numbers.",
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is even.",
    "Write a Python function that returns the largest item of a list.",
    "Write a Python function that counts the vowels in a string.",
]
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)
_SNAKE = re.compile(r"^_{0,2}[a-z][a-z0-9_]*$")


def extract_code(text: str) -> str:
    """The code inside the first fenced block, or the whole text when there is none."""
    match = _FENCE.search(text)
    return match.group(1) if match else text


def syntax_reward(generated: str) -> float:
    """1.0 when the code parses as Python (``ast.parse``; nothing is executed), else 0.0."""
    code = extract_code(generated)
    if not code.strip():
        return 0.0
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return 0.0
    return 1.0


def style_reward(generated: str, max_line_length: int = 79) -> float:
    """Fraction of simple PEP 8 checks passed: line length, no tabs or trailing spaces,
    snake_case function names, docstrings on functions. Unparsable code scores 0."""
    code = extract_code(generated)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return 0.0
    lines = code.splitlines() or [""]
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    checks = [
        all(len(line) <= max_line_length for line in lines),
        not any("\t" in line for line in lines),
        not any(line != line.rstrip() for line in lines),
        bool(functions) and all(_SNAKE.match(f.name) for f in functions),
        bool(functions) and all(ast.get_docstring(f) for f in functions),
    ]
    return sum(checks) / len(checks)


def create_code_generation_env(
    tokenizer,
    prompts: Sequence[str] | None = None,
    reward_weights: Mapping[str, float] | None = None,
    max_length: int = 512,
    **kwargs,
) -> MultiObjectiveRewardEnv:
    """Code generation scored on syntax (1.0) and style (0.5); code is parsed, never run."""
    return MultiObjectiveRewardEnv(
        tokenizer,
        list(prompts or DEFAULT_CODE_PROMPTS),
        reward_components={
            "syntax": lambda prompt, generated, full_text: syntax_reward(generated),
            "style": lambda prompt, generated, full_text: style_reward(generated),
        },
        reward_weights=reward_weights or {"syntax": 1.0, "style": 0.5},
        max_length=max_length,
        **kwargs,
    )
