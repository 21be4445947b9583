"""Turn every accepted input shape into the canonical record of :mod:`alignflow.data.schema`.

Shapes (detected per row, after the column mapping is applied):

- pairwise ``prompt``/``chosen``/``rejected`` (text or chat-message lists);
- implicit-prompt pairs: ``chosen``/``rejected`` only. Text transcripts (HH-RLHF) are split
  at the last ``"\\n\\nAssistant:"``; message lists at their longest shared prefix;
- a text ``prompt`` beside message-list ``chosen``/``rejected`` (UltraFeedback-binarized):
  whole dialogues are split at their shared prefix, which must hold the prompt as a user
  turn; assistant-only lists get the prompt as their user turn;
- labelled pairs ``prompt``/``response_a``/``response_b``/``preferred`` (the mapping
  ``input``/``output_1``/``output_2``/``label`` is applied by default);
- scored feedback ``prompt``/``response`` (or ``completion``)/``score``;
- ranked responses to one prompt: ``chosen``/``rejected`` holding lists of responses
  (RewardBench 2, RM-Bench), or ``responses`` with ``scores`` or ``ranks`` beside them, or
  as records carrying their own text and score or rank (UltraFeedback's ``completions``,
  Nectar's ``answers``, mapped to ``responses``);
- unpaired (KTO) ``prompt``/``completion``/``label``;
- prompt-only ``prompt``.

Columns the contract does not name go into ``metadata`` so nothing the annotator sent is
lost. A row that fits no shape raises :class:`RowError` with a reason code and field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from alignflow.data.issues import Reason
from alignflow.data.schema import RecordKind

HH_ASSISTANT = "\n\nAssistant:"
# data.response_fields: the key of a response record's text and of its score or rank
ResponseFields = Mapping[Literal["text", "score", "rank"], str]
DEFAULT_MAPPING = {
    "input": "prompt",
    "instruction": "prompt",
    "question": "prompt",  # GSM8K and most QA sets
    "output_1": "response_a",
    "output_2": "response_b",
    "preference": "preferred",
}
_RESERVED = {
    "id",
    "prompt",
    "chosen",
    "rejected",
    "completion",
    "response",
    "score",
    "label",
    "margin",
    "source",
    "metadata",
    "response_a",
    "response_b",
    "preferred",
    "messages",
    "responses",
    "scores",
    "ranks",
}
RESERVED_COLUMNS = frozenset(_RESERVED)
_PREFERRED_A = {1, "1", "a", "A", "model_a", "output_1", "response_a"}
_PREFERRED_B = {2, "2", "b", "B", "model_b", "output_2", "response_b"}
# keys of a response given as a record: its text, and a score (higher is better) or a rank
RESPONSE_TEXT_KEYS = ("response", "answer", "completion", "text", "output", "content")
RESPONSE_SCORE_KEYS = ("score", "overall_score", "rating", "reward")
RESPONSE_RANK_KEYS = ("rank",)
_TRUE = {True, "1", "true", "True", "yes"}
_FALSE = {False, "0", "false", "False", "no"}


class RowError(ValueError):
    """A row that cannot be normalised: carries the reason code and the offending field."""

    def __init__(self, code: Reason, message: str, field: str | None = None):
        super().__init__(message)
        self.code, self.field = code, field


def apply_mapping(row: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """Rename input columns to canonical names; user mapping first, then the labelled-pair default.

    A dotted source reaches into nested fields, list items by position: ``question.full_text``
    (WebGPT comparisons), ``summaries.0.text`` (summarize-from-feedback); the nested column
    itself stays, in the record's metadata.
    """
    renamed = dict(row)
    for mapping_ in (mapping, DEFAULT_MAPPING):
        for source, target in mapping_.items():
            if target in renamed:
                continue
            if source in renamed:
                renamed[target] = renamed.pop(source)
            elif "." in source:
                found, value = _nested(renamed, source.split("."))
                if found:
                    renamed[target] = value
    if "label" in renamed and "response_a" in renamed and "preferred" not in renamed:
        renamed["preferred"] = renamed.pop("label")
    return renamed


def _nested(value: Any, path: list[str]) -> tuple[bool, Any]:
    """(True, the value at ``path``) through dicts and lists, or (False, None) where it breaks off."""
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def detect_kind(row: dict[str, Any]) -> str:
    """Which shape of the data contract a (mapped) row has; raises RowError when none fits."""
    present = {k for k, v in row.items() if v is not None}
    if "responses" in present or is_response_list(row.get("chosen")) or is_response_list(row.get("rejected")):
        return "ranked"
    if {"chosen", "rejected"} & present:
        return "pair"
    if {"response_a", "response_b"} & present:
        return "labelled"
    if "score" in row and ({"response", "completion"} & present):
        return "scored"
    if "label" in row and "completion" in present:
        return "unpaired"
    if "completion" in present or "response" in present:
        return "scored" if "score" in row else "unpaired"
    if "prompt" in present or "messages" in present:
        return "prompt"
    message = f"no known shape fits columns {sorted(row)}{_mapping_hint(row)}"
    raise RowError(Reason.UNKNOWN_SHAPE, message, None)


def _mapping_hint(row: dict[str, Any]) -> str:
    """For columns named like the contract's but for case or spaces ('Chosen', ' prompt'), the
    mapping that reads them; names are not guessed silently, so the user says it once."""
    named = {c: c.strip().lower() for c in row if isinstance(c, str)}
    renames = sorted((c, name) for c, name in named.items() if c != name and name in _RESERVED)
    hints = [f"data.column_mapping.{c}={name}" for c, name in renames]
    return f" (map them: {', '.join(hints)})" if hints else ""


def normalize_row(
    row: dict[str, Any],
    mapping: dict[str, str] | None = None,
    preferred_values: Mapping[str, str] | None = None,
    score_range: tuple[float, float] = (0.0, 1.0),
    response_fields: ResponseFields | None = None,
) -> dict[str, Any]:
    """One input row -> one canonical record (``kind`` set, extra columns in metadata).

    ``preferred_values`` says which response each value of a labelled pair's ``preferred``
    column names ('a', 'b' or 'tie'); without it the common spellings are read (1/2, a/b...).
    ``score_range`` is the scale a scored row's score is on; the record holds it in [0, 1].
    ``response_fields`` names the ``text`` and ``score`` (or ``rank``) keys of responses given
    as records; without it the common names are looked for.
    """
    mapped = apply_mapping(row, mapping or {})
    kind = detect_kind(mapped)
    if kind == "labelled":
        record = _labelled(mapped, preferred_values)
    elif kind == "scored":
        record = _scored(mapped, score_range)
    elif kind == "ranked":
        record = _ranked(mapped, response_fields or {})
    else:
        record = _NORMALISERS[kind](mapped)
    record["id"] = None if mapped.get("id") is None else str(mapped["id"])
    record["source"] = None if mapped.get("source") is None else str(mapped["source"])
    record["metadata"] = _metadata(mapped) | record.get("metadata", {})
    return record


def _metadata(row: dict[str, Any]) -> dict[str, Any]:
    base = row.get("metadata")
    meta = dict(base) if isinstance(base, dict) else ({} if base is None else {"metadata": base})
    for key, value in row.items():
        if key not in _RESERVED and value is not None:
            meta[key] = value
    return meta


def _required(row: dict[str, Any], field: str) -> Any:
    if row.get(field) is None:
        raise RowError(Reason.MISSING_FIELD, f"{field!r} is missing", field)
    return row[field]


def _pair(row: dict[str, Any]) -> dict[str, Any]:
    chosen, rejected = _required(row, "chosen"), _required(row, "rejected")
    prompt = row.get("prompt")
    if prompt is None:
        prompt, chosen, rejected = split_implicit_prompt(chosen, rejected)
    elif isinstance(prompt, str) and isinstance(chosen, list) and isinstance(rejected, list):
        prompt, chosen, rejected = text_prompt_with_dialogues(prompt, chosen, rejected)
    record = {"kind": RecordKind.PAIR, "prompt": prompt, "chosen": chosen, "rejected": rejected}
    if row.get("margin") is not None:
        margin = _number(row, "margin")
        if not math.isfinite(margin):  # one such margin turns the whole batch's loss into NaN
            raise RowError(Reason.SCORE_INVALID, f"margin {margin} is not a finite number", "margin")
        record["margin"] = margin
    return record


def _labelled(row: dict[str, Any], preferred_values: Mapping[str, str] | None = None) -> dict[str, Any]:
    a, b = _required(row, "response_a"), _required(row, "response_b")
    winner = _winner(_required(row, "preferred"), preferred_values)
    if winner == "tie":
        message = f"preference {row['preferred']!r} is a tie: neither response wins"
        raise RowError(Reason.TIE, message, "preferred")
    chosen, rejected = (a, b) if winner == "a" else (b, a)
    # the two responses may be whole dialogues (Chatbot Arena): read them as a pair would be
    return _pair({"prompt": row.get("prompt"), "chosen": chosen, "rejected": rejected})


def _scored(row: dict[str, Any], score_range: tuple[float, float] = (0.0, 1.0)) -> dict[str, Any]:
    completion = row.get("completion") if row.get("completion") is not None else row.get("response")
    if completion is None:
        raise RowError(Reason.MISSING_FIELD, "'response' is missing", "response")
    score = _number(row, "score")
    if math.isnan(score):
        raise RowError(Reason.SCORE_INVALID, "score is NaN", "score")
    low, high = score_range
    if not low <= score <= high:
        message = f"score {score:g} is outside [{low:g}, {high:g}] (data.score_range)"
        raise RowError(Reason.SCORE_OUT_OF_RANGE, message, "score")
    return {
        "kind": RecordKind.SCORED,
        "prompt": _required(row, "prompt"),
        "completion": completion,
        "score": (score - low) / (high - low),
    }


def is_response_list(value: Any) -> bool:
    """A list of responses (texts or message lists), as opposed to one message list."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, str | list) for v in value)


def _ranked(row: dict[str, Any], fields: ResponseFields) -> dict[str, Any]:
    """Responses to one prompt with an order: every response with a higher score is preferred
    to every one with a lower score. Lists of chosen and rejected responses score 1 and 0."""
    prompt = _required(row, "prompt")
    if row.get("responses") is not None:
        responses, scores, details = _rated_responses(row, fields)
    else:
        chosen, rejected = _side(row, "chosen"), _side(row, "rejected")
        responses, scores, details = chosen + rejected, [1.0] * len(chosen) + [0.0] * len(rejected), []
    if len(responses) < 2:
        raise RowError(
            Reason.MISSING_FIELD, "'responses' holds fewer than two responses to rank", "responses"
        )
    if len(set(scores)) < 2:
        raise RowError(Reason.TIE, f"all {len(responses)} responses rank equal: none is preferred", "scores")
    record = {"kind": RecordKind.RANKED, "prompt": prompt, "responses": responses, "scores": scores}
    if any(details):
        record["metadata"] = {"response_details": details}
    return record


def _side(row: dict[str, Any], field: str) -> list[Any]:
    """One side of a ranked row as a list: a single response (text or messages) is a list of one."""
    value = _required(row, field)
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], dict)):
        return [value]
    if not isinstance(value, list) or not value:
        raise RowError(Reason.MISSING_FIELD, f"{field!r} holds no response", field)
    for i, item in enumerate(value):  # named here, as the file has it, not as responses[k]
        if not isinstance(item, str | list):
            message = f"'{field}[{i}]' is {type(item).__name__}, expected text or messages"
            raise RowError(Reason.NON_STRING_FIELD, message, field)
    return value


def _rated_responses(row: dict[str, Any], fields: ResponseFields) -> tuple[list, list[float], list[dict]]:
    """Responses with their scores (higher is better; a rank counts as minus itself), and what
    else each response record carried (its model, annotations...), kept for the metadata."""
    responses = row["responses"]
    if not isinstance(responses, list):
        raise RowError(
            Reason.NON_STRING_FIELD,
            f"'responses' is {type(responses).__name__}, expected a list",
            "responses",
        )
    if responses and all(isinstance(r, dict) and "role" not in r for r in responses):
        return _response_records(responses, fields)
    if row.get("scores") is not None:
        values, sign, field = row["scores"], 1.0, "scores"
    elif row.get("ranks") is not None:
        values, sign, field = row["ranks"], -1.0, "ranks"
    else:
        raise RowError(Reason.MISSING_FIELD, "'responses' needs 'scores' or 'ranks' beside it", "scores")
    if not isinstance(values, list) or len(values) != len(responses):
        count = len(values) if isinstance(values, list) else type(values).__name__
        message = f"{field!r} has {count} values for {len(responses)} responses"
        raise RowError(Reason.SCORE_INVALID, message, field)
    return responses, [sign * _finite(v, f"{field}[{i}]", field) for i, v in enumerate(values)], []


def _response_records(records: list[dict], fields: ResponseFields) -> tuple[list, list[float], list[dict]]:
    """Responses given as records (UltraFeedback ``completions``, Nectar ``answers``)."""
    text = fields.get("text") or _first_key(records, RESPONSE_TEXT_KEYS, "text")
    if "score" in fields or "rank" in fields:
        key, sign = (fields["score"], 1.0) if "score" in fields else (fields["rank"], -1.0)
    else:
        score = _first_key(records, (*RESPONSE_SCORE_KEYS, *RESPONSE_RANK_KEYS), "score")
        key, sign = score, -1.0 if score in RESPONSE_RANK_KEYS else 1.0
    responses, scores = [], []
    for i, item in enumerate(records):
        if item.get(text) is None:
            raise RowError(Reason.MISSING_FIELD, f"responses[{i}] has no {text!r}", "responses")
        responses.append(item[text])
        scores.append(sign * _finite(item.get(key), f"responses[{i}].{key}", "responses"))
    details = [{k: v for k, v in item.items() if k not in (text, key)} for item in records]
    return responses, scores, details


def _first_key(records: list[dict], names: tuple[str, ...], what: str) -> str:
    """The first of ``names`` that the first response record has; RowError naming its keys if none."""
    for name in names:
        if name in records[0]:
            return name
    message = (
        f"responses[0] has no {what} key among {list(names)} (its keys: {sorted(records[0])}); "
        f"name it with data.response_fields.{what}"
    )
    raise RowError(Reason.MISSING_FIELD, message, "responses")


def _finite(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RowError(Reason.SCORE_INVALID, f"{where} {value!r} is not a number", field)
    try:
        number = float(value)
    except ValueError:
        raise RowError(Reason.SCORE_INVALID, f"{where} {value!r} is not a number", field) from None
    if not math.isfinite(number):
        raise RowError(Reason.SCORE_INVALID, f"{where} {value!r} is not a finite number", field)
    return number


def _unpaired(row: dict[str, Any]) -> dict[str, Any]:
    label = _required(row, "label")
    if _is_one_of(label, _TRUE):
        flag = True
    elif _is_one_of(label, _FALSE):
        flag = False
    else:
        raise RowError(Reason.BAD_LABEL, f"label {label!r} is not a boolean (true/false, 1/0)", "label")
    completion = row.get("completion") if row.get("completion") is not None else row.get("response")
    return {
        "kind": RecordKind.UNPAIRED,
        "prompt": _required(row, "prompt"),
        "completion": completion,
        "label": flag,
    }


def _prompt(row: dict[str, Any]) -> dict[str, Any]:
    """A prompt to answer. A conversation that ends with the assistant's turns (an SFT-style
    ``messages`` row) is a prompt up to its last user turn; the reply it held is kept in
    metadata as ``reference_completion``, where generating after it would continue a finished
    exchange."""
    prompt = row.get("prompt") if row.get("prompt") is not None else row.get("messages")
    record: dict[str, Any] = {"kind": RecordKind.PROMPT, "prompt": prompt}
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        end = len(prompt)
        while end and prompt[end - 1].get("role") == "assistant":
            end -= 1
        if end == 0:
            raise RowError(Reason.BAD_CHAT, "the conversation has no turn before the assistant's", "prompt")
        if end < len(prompt):
            record["prompt"] = prompt[:end]
            record["metadata"] = {"reference_completion": prompt[end:]}
    return record


def _winner(preferred: Any, preferred_values: Mapping[str, str] | None) -> str:
    """'a', 'b' or 'tie' for a labelled pair's ``preferred`` value; RowError when it names neither."""
    if preferred_values:
        key = label_key(preferred)
        if key is not None and key in preferred_values:  # keys are strings: None is never one
            return preferred_values[key]
        raise RowError(
            Reason.BAD_LABEL,
            f"preference {preferred!r} is not one of data.preferred_values {sorted(preferred_values)}",
            "preferred",
        )
    if _is_one_of(preferred, _PREFERRED_A):
        return "a"
    if _is_one_of(preferred, _PREFERRED_B):
        return "b"
    if isinstance(preferred, str) and preferred.strip().lower().startswith("tie"):
        return "tie"  # Chatbot Arena's 'tie' and 'tie (bothbad)'
    raise RowError(
        Reason.BAD_LABEL,
        f"preference {preferred!r} names neither response (1/2, a/b, model_a/model_b; "
        "other codings such as 0/1 need data.preferred_values)",
        "preferred",
    )


def label_key(value: Any) -> str | None:
    """A label value as the string key of ``data.preferred_values``: 1, 1.0 and '1' all read '1'."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # a Parquet/pandas integer column with gaps comes back as floats
    if isinstance(value, int | float):
        return str(value)
    return value.strip() if isinstance(value, str) else None


def _is_one_of(value: Any, allowed: set) -> bool:
    """Set membership that tolerates unhashable values and refuses floats such as 1.0 or NaN."""
    if isinstance(value, float | list | dict):
        return False
    return value in allowed


def _number(row: dict[str, Any], field: str) -> float:
    value = row.get(field)
    if isinstance(value, bool) or value is None:
        raise RowError(Reason.SCORE_INVALID, f"{field} {value!r} is not a number", field)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RowError(Reason.SCORE_INVALID, f"{field} {value!r} is not a number", field) from None


def split_implicit_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """Recover the shared prompt of two whole dialogues (HH-RLHF text or message lists)."""
    if isinstance(chosen, str) and isinstance(rejected, str):
        return split_hh_transcripts(chosen, rejected)
    if isinstance(chosen, list) and isinstance(rejected, list):
        shared = 0
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        if shared == 0:
            raise RowError(
                Reason.HH_UNSPLITTABLE, "chosen and rejected dialogues share no prompt turns", "prompt"
            )
        return chosen[:shared], chosen[shared:], rejected[shared:]
    raise RowError(
        Reason.MISSING_FIELD, "'prompt' is missing and chosen/rejected are not dialogues", "prompt"
    )


def _roles(messages: list) -> set[Any]:
    return {m.get("role") for m in messages if isinstance(m, dict)}


def text_prompt_with_dialogues(prompt: str, chosen: list, rejected: list) -> tuple[list, list, list]:
    """A text prompt with message-list answers, as one chat record.

    Datasets such as UltraFeedback-binarized repeat the prompt as the first turn of both whole
    dialogues: the dialogues' shared turns become the prompt, once the text prompt is found among
    their user turns (so a prompt column that belongs to another row is not silently replaced).
    Answers given as assistant turns alone get the text prompt as their user turn.
    """
    if _roles(chosen) | _roles(rejected) <= {"assistant"}:
        return [{"role": "user", "content": prompt}], chosen, rejected
    shared, chosen, rejected = split_implicit_prompt(chosen, rejected)
    user_turns = [m.get("content") for m in shared if isinstance(m, dict) and m.get("role") == "user"]
    if not any(isinstance(t, str) and t.strip() == prompt.strip() for t in user_turns):
        raise RowError(
            Reason.BAD_CHAT, "'prompt' is not a user turn of the chosen/rejected dialogues", "prompt"
        )
    return shared, chosen, rejected


def split_hh_transcripts(chosen: str, rejected: str) -> tuple[str, str, str]:
    """HH-RLHF: the prompt runs up to and including the last ``"\\n\\nAssistant:"`` of each side."""
    cut_c, cut_r = chosen.rfind(HH_ASSISTANT), rejected.rfind(HH_ASSISTANT)
    if cut_c < 0 and cut_r < 0:  # plain answers, not transcripts: the prompt column is what is missing
        raise RowError(
            Reason.MISSING_FIELD,
            "'prompt' is missing and chosen/rejected are not HH-RLHF transcripts to take it from",
            "prompt",
        )
    if cut_c < 0 or cut_r < 0:
        raise RowError(Reason.HH_UNSPLITTABLE, "no '\\n\\nAssistant:' turn to split the prompt at", "prompt")
    end_c, end_r = cut_c + len(HH_ASSISTANT), cut_r + len(HH_ASSISTANT)
    if chosen[:end_c] != rejected[:end_r]:
        raise RowError(
            Reason.HH_UNSPLITTABLE,
            "chosen and rejected differ before their last assistant turn, so no shared prompt",
            "prompt",
        )
    return chosen[:end_c], chosen[end_c:].lstrip(" "), rejected[end_r:].lstrip(" ")


_NORMALISERS = {  # the kinds with no option of their own (labelled and scored rows take one)
    "pair": _pair,
    "unpaired": _unpaired,
    "prompt": _prompt,
}
