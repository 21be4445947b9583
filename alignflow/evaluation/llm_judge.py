"""LLM-as-judge over any OpenAI-compatible chat-completions server (vLLM, llama.cpp, Ollama, OpenAI).

The judge model sees the prompt and two responses and answers "A", "B" or "tie". Judge
models favour one position, so by default every pair is asked in both orders and a verdict
that flips with the order counts as a tie. A reply that cannot be read leaves that row
unjudged (``None``); a server that cannot be reached or keeps failing raises ``JudgeError``,
because all-``None`` verdicts would look like a real (empty) result.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from alignflow.evaluation.judges import Verdict, _check_lengths

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful, impartial judge of assistant responses. Prefer the response that is "
    "correct, helpful and follows the user's instructions. Ignore the order the responses are "
    "shown in, their length and their style unless it matters to the user."
)

_USER_TEMPLATE = """Compare two responses to the same conversation.

[Conversation]
{prompt}
[End of Conversation]

[Response A]
{a}
[End of Response A]

[Response B]
{b}
[End of Response B]

Which response is better? Reply with exactly one word: "A", "B" or "tie"."""

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_CHOICES = {"a": "A", "b": "B", "tie": "tie"}
_RETRY_STATUS = {429, 500, 502, 503, 504}


class JudgeError(RuntimeError):
    """The judge server could not be reached or kept failing; no verdicts were produced."""


def render_prompt(prompt: Any) -> str:
    """Show a string prompt as is and a chat (list of {role, content}) as "role: content" lines."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt)
    return str(prompt)


def parse_choice(reply: str | None) -> str | None:
    """Read "A", "B" or "tie" from a judge reply: its first word, else its last; None otherwise.

    Reasoning models' ``<think>`` blocks are dropped first, so only the final answer counts.
    """
    words = re.findall(r"[a-z]+", _THINK.sub("", reply or "").lower())
    for word in words[:1] + words[-1:]:
        if word in _CHOICES:
            return _CHOICES[word]
    return None


class OpenAIJudge:
    """Pairwise judge that asks a chat model served behind ``{base_url}/chat/completions``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 30,
        max_retries: int = 2,
        swap_positions: bool = True,
        system_prompt: str | None = None,
        name: str = "llm",
        concurrency: int = 4,
        max_tokens: int = 16,
        retry_backoff: float = 0.5,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.timeout = timeout
        self.max_retries = max(0, max_retries)
        self.swap_positions = swap_positions
        self.system_prompt = system_prompt or DEFAULT_SYSTEM_PROMPT
        self.name = name
        self.concurrency = max(1, concurrency)
        self.max_tokens = max_tokens
        self.retry_backoff = retry_backoff

    def compare(self, prompts, a, b, metadata=None) -> list[Verdict]:
        _check_lengths(prompts, a, b)
        rendered = [render_prompt(p) for p in prompts]
        asks = list(zip(rendered, a, b, strict=True))
        if self.swap_positions:
            asks += list(zip(rendered, b, a, strict=True))
        if not asks:
            return []
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        with httpx.Client(timeout=self.timeout, headers=headers) as client:
            pool = ThreadPoolExecutor(max_workers=self.concurrency)
            try:
                choices = list(pool.map(lambda ask: parse_choice(self._ask(client, *ask)), asks))
            finally:
                # a JudgeError should not wait for every queued request to fail too
                pool.shutdown(cancel_futures=True)
        n = len(rendered)
        first = [_to_verdict(c, swapped=False) for c in choices[:n]]
        if not self.swap_positions:
            return first
        second = [_to_verdict(c, swapped=True) for c in choices[n:]]
        return [_combine(v1, v2) for v1, v2 in zip(first, second, strict=True)]

    def _ask(self, client: httpx.Client, prompt: str, response_a: str, response_b: str) -> str | None:
        """One chat completion, retried on connection errors, 429 and 5xx; returns the reply text."""
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": _USER_TEMPLATE.format(prompt=prompt, a=response_a, b=response_b)},
            ],
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.retry_backoff * 2 ** (attempt - 1))
            try:
                response = client.post(self.url, json=body)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in _RETRY_STATUS:
                failure = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.is_error:
                raise JudgeError(
                    f"judge request to {self.url} failed with HTTP {response.status_code}: "
                    f"{response.text[:200]}"
                )
            try:
                return response.json()["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise JudgeError(
                    f"judge server at {self.url} sent no chat completion: {response.text[:200]}"
                ) from exc
        raise JudgeError(
            f"judge request to {self.url} failed after {self.max_retries + 1} attempts: {failure}"
        )


def _to_verdict(choice: str | None, swapped: bool) -> Verdict:
    if choice is None:
        return None
    if choice == "tie":
        return 0.5
    a_won = choice == "A"
    return float(a_won != swapped)


def _combine(v1: Verdict, v2: Verdict) -> Verdict:
    """Both orders must agree for a win; a flip with position is a tie, an unread reply unjudged."""
    if v1 is None or v2 is None:
        return None
    return v1 if v1 == v2 else 0.5
