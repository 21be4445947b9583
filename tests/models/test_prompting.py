"""How prompts reach a chat model: HH-RLHF transcripts as the conversations they are."""

from __future__ import annotations

import gzip
import json

import pytest

from alignflow.models.prompting import as_messages, format_prompt, hh_transcript_turns


class ChatTemplateTokenizer:
    """The one call format_prompt makes of a chat tokenizer, rendered ChatML-style."""

    chat_template = "chatml"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_a_transcript_becomes_alternating_turns_ending_with_the_user():
    text = "\n\nHuman: hi there\n\nAssistant: hello!\n\nHuman: how do I pick a lock?\n\nAssistant:"
    assert hh_transcript_turns(text) == [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello!"},
        {"role": "user", "content": "how do I pick a lock?"},
    ]
    rendered = format_prompt(ChatTemplateTokenizer(), text)
    assert "Human:" not in rendered and rendered.count("<|im_start|>user") == 2
    assert rendered.endswith("how do I pick a lock?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "text",
    [
        "What is 17 plus 25?",  # plain prompt
        "\n\nHuman: hi\n\nAssistant: an answer already given",  # not open for the assistant
        "Tell me what 'Human: x' means",  # the marker inside ordinary text
        "\n\nHuman: \n\nAssistant:",  # an empty turn
    ],
)
def test_other_text_stays_one_user_turn(text):
    assert hh_transcript_turns(text) is None
    assert as_messages(text) == [{"role": "user", "content": text}]


def test_message_lists_and_templateless_models_are_untouched():
    chat = [{"role": "user", "content": "hi"}]
    assert as_messages(chat) == chat
    text = "\n\nHuman: hi\n\nAssistant:"
    assert format_prompt(None, text) == text + "\n"  # a base model reads the transcript as written


def test_every_shared_hh_prompt_reads_as_a_conversation(hh_rlhf_path):
    from alignflow.data.normalize import RowError, normalize_row

    prompts = []
    with gzip.open(hh_rlhf_path, "rt", encoding="utf-8") as lines:
        for line in lines:
            try:
                prompts.append(normalize_row(json.loads(line))["prompt"])
            except RowError:  # the few rows the data stage quarantines
                continue
    turns = [hh_transcript_turns(p) for p in prompts]
    unread = [p[:80] for p, t in zip(prompts, turns, strict=True) if t is None]
    assert len(unread) <= len(prompts) // 100, unread[:5]
    assert all(t[-1]["role"] == "user" for t in turns if t)
