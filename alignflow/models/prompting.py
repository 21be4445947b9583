"""The one way prompts are shown to a policy, and the one way completions are sampled.

SFT, DPO, GRPO, PPO and evaluation must agree on the exact prompt text, or a policy is
evaluated on a format it never trained on. Every stage therefore renders prompts with
:func:`format_prompt` (the tokenizer's chat template when it has one) and trains on
``format_prompt(prompt) + completion``; evaluation and PPO sample with :func:`generate`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import torch

from alignflow.errors import InputError
from alignflow.models.decoding import cpu_decoding
from alignflow.models.positions import prompt_token_budget
from alignflow.models.shared_prefill import generate_sharing_prefix

Prompt = str | list[dict[str, str]]


# an Anthropic HH-RLHF transcript: "\n\nHuman: ...\n\nAssistant: ...\n\nHuman: ...\n\nAssistant:"
_HH_TURN = re.compile(r"\n\n(Human|Assistant):[ ]?")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def hh_transcript_turns(text: str) -> list[dict[str, str]] | None:
    """The turns of an HH-RLHF transcript prompt (it ends on an open ``Assistant:`` turn), or
    None for any other text. A chat model reads them through its template as the conversation
    they are, not as one user message that happens to contain a dialogue."""
    body = "\n\n" + text.lstrip("\n")
    if not body.startswith("\n\nHuman:") or not body.rstrip(" ").endswith("\n\nAssistant:"):
        return None
    parts = _HH_TURN.split(body.rstrip(" "))
    roles, contents = parts[1::2], parts[2::2]
    turns = [{"role": _HH_ROLES[r], "content": c.strip()} for r, c in zip(roles, contents, strict=True)]
    if turns[-1]["content"] or any(not t["content"] for t in turns[:-1]):
        return None  # text after the last "Assistant:", or an empty turn: not a transcript prompt
    return turns[:-1]


def as_messages(prompt: Prompt) -> list[dict[str, str]]:
    """A plain-text prompt becomes one user turn (an HH-RLHF transcript, its turns); a message
    list is kept as it is."""
    if not isinstance(prompt, str):
        return list(prompt)
    return hh_transcript_turns(prompt) or [{"role": "user", "content": prompt}]


def format_prompt(tokenizer: Any, prompt: Prompt) -> str:
    """The text a policy sees before it answers ``prompt``.

    With a chat template: the rendered conversation plus the assistant's opening marker.
    Without one (a base model): the prompt followed by a newline.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(as_messages(prompt), tokenize=False, add_generation_prompt=True)
    if not isinstance(prompt, str):
        return "\n".join(f"{m['role']}: {m['content']}" for m in prompt) + "\nassistant: "
    return prompt + "\n"


def text_key(text: Prompt) -> str:
    """A prompt or completion, text or message list, as a dictionary key."""
    return text if isinstance(text, str) else json.dumps(text, sort_keys=True)


def completion_text(completion: str | list[dict[str, str]]) -> str:
    """A completion as plain text (the assistant turns' contents for a message list)."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m.get("role", "assistant") == "assistant")


def prompt_batch(tokenizer: Any, prompts: Sequence[Prompt], budget: int | None) -> Any:
    """Formatted prompts as a left-padded batch, each cut from the left to ``budget`` tokens
    (:func:`~alignflow.models.positions.prompt_token_budget`): the question usually ends a
    prompt, and a GPT-2-style model would crash on positions past its table."""
    return left_padded_batch(tokenizer, [format_prompt(tokenizer, p) for p in prompts], budget)


def left_padded_batch(tokenizer: Any, texts: Sequence[str], budget: int | None) -> Any:
    """Texts as a batch padded and, past ``budget`` tokens (None: no cut), cut on the left,
    so every row ends where its text does; the tokenizer's sides are restored after."""
    sides = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side = tokenizer.truncation_side = "left"
    try:
        return tokenizer(
            list(texts),
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
            truncation=budget is not None,
            max_length=budget,
        )
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = sides


def prompts_cut(tokenizer: Any, prompts: Sequence[Prompt], budget: int | None) -> int:
    """How many of ``prompts`` :func:`prompt_batch` cuts to ``budget`` tokens."""
    if budget is None:
        return 0
    return sum(length > budget for length in prompt_lengths(tokenizer, prompts))


def prompt_lengths(tokenizer: Any, prompts: Sequence[Prompt]) -> list[int]:
    """Each prompt's token count as the model reads it (chat template applied, no cut)."""
    if not prompts:
        return []
    encoded = tokenizer([format_prompt(tokenizer, p) for p in prompts], add_special_tokens=False)
    return [len(ids) for ids in encoded["input_ids"]]


def cut_prompt_text(tokenizer: Any, text: str, budget: int) -> str:
    """``text`` cut from the left until ``tokenizer(text)`` holds at most ``budget`` tokens:
    for trainers that tokenize prompt text themselves (TRL's GRPO has no prompt limit)."""
    if len(tokenizer(text)["input_ids"]) <= budget:
        return text
    content = tokenizer(text, add_special_tokens=False)["input_ids"]
    for keep in range(min(budget, len(content)), 0, -1):
        cut = tokenizer.decode(content[-keep:])
        if len(tokenizer(cut)["input_ids"]) <= budget:  # decoding and re-reading may merge tokens
            return cut
    raise InputError(f"no tail of the prompt fits in {budget} tokens")


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    max_new_tokens: int = 16,
    do_sample: bool = False,
    temperature: float = 1.0,
    batch_size: int = 32,
    seed: int | None = None,
    top_p: float | None = None,
) -> list[str]:
    """Completions (decoded, special tokens removed) for ``prompts``, in order.

    Prompts are left-padded so every row continues right where its prompt ends, and
    left-truncated where a model's position table leaves no room for ``max_new_tokens``
    after them (:func:`prompt_batch`). Batches are drawn in order of prompt length, so a
    batch of short prompts is not padded to one long conversation (on HH-RLHF's prompts
    most of an unsorted batch was padding). ``top_p`` (None: the model's generation config)
    applies only where it samples.
    """
    if seed is not None:
        torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = next(model.parameters()).device
    budget = prompt_token_budget(tokenizer, max_new_tokens, model)
    outputs = [""] * len(prompts)
    order = longest_first(tokenizer, prompts)
    sample_args: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature} if do_sample else {"do_sample": False}
    )
    if do_sample and top_p is not None:
        sample_args["top_p"] = top_p
    try:
        with cpu_decoding(model):
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                batch = prompt_batch(tokenizer, [prompts[i] for i in rows], budget).to(device)
                ids = generate_sharing_prefix(
                    model,
                    batch["input_ids"],
                    batch["attention_mask"],
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                    **sample_args,
                )
                answers = tokenizer.batch_decode(
                    ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
                )
                for i, answer in zip(rows, answers, strict=True):
                    outputs[i] = answer
    finally:
        model.train(was_training)
    return outputs


def longest_first(tokenizer: Any, prompts: Sequence[Prompt]) -> list[int]:
    """Indices of ``prompts`` by formatted token length, longest first (ties keep their order):
    the first batch shows the peak memory, and each batch pads to similar lengths."""
    lengths = prompt_lengths(tokenizer, prompts)
    return sorted(range(len(prompts)), key=lambda i: -lengths[i])
