"""Every format and every shape of the data contract reads into the same canonical records."""

from __future__ import annotations

import codecs
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from alignflow.data.config import DataConfig
from alignflow.data.normalize import RowError, normalize_row, split_hh_transcripts
from alignflow.data.readers import FormatError, detect_format, read_rows
from alignflow.data.validation import validate_paths

ROWS = [
    {"prompt": f"What is {i} plus 2?", "chosen": f"The answer is {i + 2}.", "rejected": "I think 0"}
    for i in range(4)
]


def write_all_formats(tmp_path):
    frame = pd.DataFrame(ROWS)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "a.json").write_text(json.dumps({"data": ROWS}))
    frame.to_parquet(tmp_path / "a.parquet")
    frame.to_csv(tmp_path / "a.csv", index=False)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress((tmp_path / "a.jsonl").read_bytes()))
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress((tmp_path / "a.csv").read_bytes()))
    (tmp_path / "noext").write_bytes((tmp_path / "a.jsonl").read_bytes())
    from datasets import Dataset

    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "hf"))
    return ["a.jsonl", "a.json", "a.parquet", "a.csv", "a.jsonl.gz", "a.csv.gz", "noext", "hf"]


def test_every_format_reads_to_the_same_records(tmp_path):
    names = write_all_formats(tmp_path)
    expected = [normalize_row(r) for r in ROWS]
    for name in names:
        validated = validate_paths(tmp_path / name)
        assert [e.record for e in validated.kept] == expected, name
        assert validated.report["input_rows"] == 4


def test_format_is_detected_and_can_be_overridden(tmp_path):
    write_all_formats(tmp_path)
    assert detect_format(tmp_path / "a.csv.gz") == "csv"
    assert detect_format(tmp_path / "noext") == "jsonl"
    assert detect_format(tmp_path / "hf") == "datasets"
    (tmp_path / "data.txt").write_bytes((tmp_path / "a.csv").read_bytes())
    with pytest.raises(FormatError):
        list(read_rows(tmp_path / "data.txt"))
    assert len(list(read_rows(tmp_path / "data.txt", fmt="csv"))) == 4


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    """Excel's "CSV UTF-8" and many Windows tools start files with a BOM (and end lines with CRLF)."""
    write_all_formats(tmp_path)
    bom = b"\xef\xbb\xbf"
    for name in ("a.jsonl", "a.json", "a.csv"):
        crlf = (tmp_path / name).read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
        (tmp_path / f"bom-{name}").write_bytes(bom + crlf)
    (tmp_path / "bom-noext").write_bytes(bom + (tmp_path / "a.jsonl").read_bytes())
    (tmp_path / "bom-a.jsonl.gz").write_bytes(gzip.compress(bom + (tmp_path / "a.jsonl").read_bytes()))
    expected = [normalize_row(r) for r in ROWS]
    for name in ("bom-a.jsonl", "bom-a.json", "bom-a.csv", "bom-noext", "bom-a.jsonl.gz"):
        rows = list(read_rows(tmp_path / name))  # row by row
        assert [r.issue for r in rows] == [None] * 4, name
        assert [normalize_row(r.data) for r in rows] == expected, name
        validated = validate_paths(tmp_path / name)  # bulk (block) reading
        assert [e.record for e in validated.kept] == expected, name
        assert validated.report["input_rows"] == 4 and not validated.issues, name


def test_hh_transcripts_split_at_the_last_assistant_turn():
    chosen = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: Knock knock."
    rejected = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: No."
    prompt, c, r = split_hh_transcripts(chosen, rejected)
    assert prompt.endswith("joke?\n\nAssistant:") and (c, r) == ("Knock knock.", "No.")
    assert normalize_row({"chosen": chosen, "rejected": rejected})["prompt"] == prompt


def test_chat_pairs_with_implicit_prompt_keep_messages():
    user = {"role": "user", "content": "hi"}
    record = normalize_row(
        {
            "chosen": [user, {"role": "assistant", "content": "hello"}],
            "rejected": [user, {"role": "assistant", "content": "go"}],
        }
    )
    assert record["prompt"] == [user] and record["chosen"] == [{"role": "assistant", "content": "hello"}]


def test_text_prompt_beside_whole_dialogues_is_read_as_one_chat_pair(tmp_path):
    """UltraFeedback-binarized: ``prompt`` is text, ``chosen``/``rejected`` repeat it as their first turn."""

    def dialogue(question, answer):
        return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    question = "Name a prime number."
    rows = [
        {"prompt": question, "chosen": dialogue(question, "7"), "rejected": dialogue(question, "8")},
        # answers as assistant turns only: the text prompt becomes their user turn
        {
            "prompt": question,
            "chosen": [{"role": "assistant", "content": "11"}],
            "rejected": [{"role": "assistant", "content": "12"}],
        },
        # the prompt column belongs to another conversation: not silently replaced
        {"prompt": "Name a colour.", "chosen": dialogue(question, "7"), "rejected": dialogue(question, "9")},
    ]
    first, second = normalize_row(rows[0]), normalize_row(rows[1])
    assert first["prompt"] == [{"role": "user", "content": question}]
    assert first["chosen"] == [{"role": "assistant", "content": "7"}]
    assert first["rejected"] == [{"role": "assistant", "content": "8"}]
    assert second["prompt"] == first["prompt"] and second["chosen"][0]["content"] == "11"
    with pytest.raises(RowError, match="not a user turn") as caught:
        normalize_row(rows[2])
    assert caught.value.field == "prompt"

    path = tmp_path / "ultrafeedback.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    validated = validate_paths(path)
    assert [e.record["chosen"][0]["content"] for e in validated.kept] == ["7", "11"]
    assert [(i.row, i.code.value, i.field) for i in validated.issues] == [(3, "bad_chat_structure", "prompt")]


def test_labelled_pairs_via_default_and_custom_mapping():
    row = {"input": "q", "output_1": "a", "output_2": "b", "label": 2}
    assert (normalize_row(row)["chosen"], normalize_row(row)["rejected"]) == ("b", "a")
    custom = {"question": "q", "ans_x": "a", "ans_y": "b", "winner": "a"}
    mapping = {"question": "prompt", "ans_x": "response_a", "ans_y": "response_b", "winner": "preferred"}
    assert normalize_row(custom, mapping)["chosen"] == "a"
    with pytest.raises(RowError) as info:
        normalize_row({**row, "label": "tie (bothbad)"})  # Chatbot Arena: counted apart from bad labels
    assert (info.value.code, info.value.field) == ("tie", "preferred")
    with pytest.raises(RowError, match="preferred_values") as info:  # 0 is index 0 in one set, "B" in another
        normalize_row({**row, "label": 0})
    assert info.value.code == "bad_label"


PKU = {"prompt": "q", "response_0": "first", "response_1": "second", "better_response_id": 1}
PKU_MAPPING = {"response_0": "response_a", "response_1": "response_b", "better_response_id": "preferred"}


@pytest.mark.parametrize(
    ("coding", "label", "chosen"),
    [
        ({"0": "a", "1": "b"}, 0, "first"),  # PKU-SafeRLHF: the index of the better response
        ({"0": "a", "1": "b"}, 1, "second"),
        ({"1": "a", "0": "b"}, 1, "first"),  # SHP: 1 when A is preferred
        ({"1": "a", "0": "b"}, 0, "second"),
        ({"0": "a", "1": "b"}, 1.0, "second"),  # an integer column with gaps, read back as floats
        ({"0": "a", "1": "b"}, "1", "second"),  # CSV
        ({"true": "a", "false": "b"}, False, "second"),
    ],
)
def test_preferred_values_say_which_response_each_label_names(coding, label, chosen):
    record = normalize_row({**PKU, "better_response_id": label}, PKU_MAPPING, coding)
    assert record["chosen"] == chosen
    assert {record["chosen"], record["rejected"]} == {"first", "second"}


def test_preferred_values_replace_the_default_reading():
    coding = {"-1": "a", "0": "tie", "1": "b"}
    assert normalize_row({**PKU, "better_response_id": -1}, PKU_MAPPING, coding)["chosen"] == "first"
    with pytest.raises(RowError) as info:
        normalize_row({**PKU, "better_response_id": 0}, PKU_MAPPING, coding)
    assert (info.value.code, info.value.field) == ("tie", "preferred")
    with pytest.raises(RowError, match=r"not one of data.preferred_values \['-1', '0', '1'\]") as info:
        normalize_row({**PKU, "better_response_id": 2}, PKU_MAPPING, coding)  # 2 = "B" by default, not here
    assert (info.value.code, info.value.field) == ("bad_label", "preferred")


def test_preferred_values_from_yaml_integer_keys_reach_every_row(tmp_path):
    rows = [{**PKU, "better_response_id": i % 2, "prompt": f"q{i}"} for i in range(4)]
    rows.append({**PKU, "better_response_id": 7, "prompt": "q7"})
    path = tmp_path / "pku.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = DataConfig(column_mapping=PKU_MAPPING, preferred_values={0: "a", 1: "b"}, max_bad_fraction=0.5)
    assert config.preferred_values == {"0": "a", "1": "b"}
    validated = validate_paths(path, config)
    assert [e.record["chosen"] for e in validated.kept] == ["first", "second", "first", "second"]
    assert [(i.row, i.code.value, i.field) for i in validated.issues] == [(5, "bad_label", "preferred")]


def test_labelled_whole_dialogues_take_their_prompt_from_the_shared_turns():
    """Chatbot Arena: two whole conversations and a winner, no prompt column."""

    def conversation(answer):
        return [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": answer}]

    mapping = {"conversation_a": "response_a", "conversation_b": "response_b", "winner": "preferred"}
    row = {
        "conversation_a": conversation("Hello!"),
        "conversation_b": conversation("Go away."),
        "winner": "model_b",
    }
    record = normalize_row(row, mapping)
    assert record["prompt"] == [{"role": "user", "content": "Hi?"}]
    assert record["chosen"] == [{"role": "assistant", "content": "Go away."}]
    assert record["rejected"] == [{"role": "assistant", "content": "Hello!"}]
    with pytest.raises(RowError, match="'prompt' is missing") as info:  # plain answers need a prompt
        normalize_row({"response_a": "x", "response_b": "y", "preferred": "a"})
    assert (info.value.code, info.value.field) == ("missing_field", "prompt")


def test_a_margin_must_be_a_finite_number(tmp_path):
    """JSON parsers accept NaN, Infinity and 1e400; one such margin makes the batch's loss NaN."""
    lines = [
        '{"prompt": "p1", "chosen": "a", "rejected": "b", "margin": 1e400}',
        '{"prompt": "p2", "chosen": "a", "rejected": "b", "margin": NaN}',
        '{"prompt": "p3", "chosen": "a", "rejected": "b", "margin": "-Infinity"}',
        '{"prompt": "p4", "chosen": "a", "rejected": "b", "margin": 2.5}',
    ]
    path = tmp_path / "margins.jsonl"
    path.write_text("\n".join(lines) + "\n")
    validated = validate_paths(path)
    assert [e.record["margin"] for e in validated.kept] == [2.5]
    assert [(i.row, i.code.value, i.field) for i in validated.issues] == [
        (row, "score_invalid", "margin") for row in (1, 2, 3)
    ]


def test_a_question_column_is_the_prompt_by_default():
    """GSM8K and most QA sets name the prompt ``question``; their ``answer`` stays in metadata."""
    record = normalize_row({"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"})
    assert record["kind"] == "prompt" and record["prompt"] == "What is 2 + 2?"
    assert record["metadata"] == {"answer": "2 + 2 = 4\n#### 4"}
    both = normalize_row({"prompt": "p", "question": "q", "chosen": "a", "rejected": "b"})
    assert both["prompt"] == "p" and both["metadata"] == {"question": "q"}  # an explicit prompt wins


def test_scored_unpaired_and_prompt_only_shapes_and_metadata():
    scored = normalize_row({"prompt": "q", "response": "r", "score": 0.3, "agent_id": "bot", "run_id": 7})
    assert scored["kind"] == "scored" and scored["completion"] == "r"
    assert scored["metadata"] == {"agent_id": "bot", "run_id": 7}
    assert normalize_row({"prompt": "q", "completion": "c", "label": "true"})["label"] is True
    assert normalize_row({"prompt": "q", "metadata": {"answer": 4}})["kind"] == "prompt"


def test_user_splits_from_a_datasets_dict_are_kept(tmp_path):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(ROWS[:3]), "test": Dataset.from_list(ROWS[3:])}).save_to_disk(
        str(tmp_path / "hf")
    )
    validated = validate_paths(tmp_path / "hf", DataConfig())
    assert sorted(e.split for e in validated.kept) == ["eval", "train", "train", "train"]


def test_scores_are_rescaled_from_the_declared_scale():
    row = {"prompt": "p", "response": "r", "score": 3}
    assert normalize_row(row, score_range=(1.0, 5.0))["score"] == 0.5
    assert normalize_row({**row, "score": 0.25})["score"] == 0.25  # the default scale is [0, 1]
    with pytest.raises(RowError, match=r"score 6 is outside \[1, 5\]") as caught:
        normalize_row({**row, "score": 6}, score_range=(1.0, 5.0))
    assert (caught.value.code, caught.value.field) == ("score_out_of_range", "score")
    with pytest.raises(ValueError, match="low < high"):
        DataConfig(score_range=(5, 1))


def test_a_downloaded_dataset_folder_reads_its_data_and_reports_the_rest(tmp_path):
    """A Hugging Face download holds README.md, a licence and .gitattributes beside the data."""
    folder = tmp_path / "hh-rlhf"
    (folder / "harmless-base").mkdir(parents=True)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# HH-RLHF\n")
    (folder / "LICENSE").write_text("MIT License\n")
    (folder / ".gitattributes").write_text("*.gz filter=lfs\n")
    rows = "".join(json.dumps(r) + "\n" for r in ROWS)
    (folder / "harmless-base" / "train.jsonl.gz").write_bytes(gzip.compress(rows.encode()))
    validated = validate_paths(folder)
    assert validated.passed and len(validated.kept) == 4 and not validated.issues
    skipped = [(w["code"], w["file"]) for w in validated.report["warnings"]]
    assert skipped == [("file_skipped", str(folder / "LICENSE")), ("file_skipped", str(folder / "README.md"))]
    formats = {Path(i["path"]).name: i["format"] for i in validated.report["inputs"]}
    assert formats == {"LICENSE": None, "README.md": None, "train.jsonl.gz": "jsonl"}
    with pytest.raises(FormatError):  # named on its own, a file of unknown format is still refused
        list(read_rows(folder / "README.md"))


def test_utf16_and_utf32_files_read_by_their_byte_order_mark(tmp_path):
    """PowerShell's `>` and Excel's "Unicode Text" write UTF-16: read as UTF-8, every line was
    quarantined as invalid JSON."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS)
    (tmp_path / "le.jsonl").write_bytes(lines.encode("utf-16"))
    (tmp_path / "be.jsonl").write_bytes(codecs.BOM_UTF16_BE + lines.encode("utf-16-be"))
    (tmp_path / "wide.json.gz").write_bytes(gzip.compress(json.dumps(ROWS).encode("utf-32")))
    pd.DataFrame(ROWS).to_csv(tmp_path / "excel.csv", index=False, encoding="utf-16")
    (tmp_path / "noext").write_bytes(lines.encode("utf-16"))
    expected = [normalize_row(r) for r in ROWS]
    for name in ("le.jsonl", "be.jsonl", "wide.json.gz", "excel.csv", "noext"):
        validated = validate_paths(tmp_path / name)
        assert [e.record for e in validated.kept] == expected, name
        assert not validated.issues, (name, validated.issues[:1])


@pytest.mark.parametrize("orient", ["columns", "index", "split", "table", "records"])
def test_json_written_by_pandas_reads_in_every_layout(tmp_path, orient):
    """``DataFrame.to_json()`` writes {column: {row: value}} by default, not a list of records."""
    path = tmp_path / f"{orient}.json"
    pd.DataFrame(ROWS).to_json(path, orient=orient, **({"index": False} if orient == "table" else {}))
    validated = validate_paths(path)
    assert [e.record for e in validated.kept] == [normalize_row(r) for r in ROWS]
    assert [e.row for e in validated.kept] == [1, 2, 3, 4] and not validated.issues


def test_dotted_sources_reach_nested_fields_and_list_items():
    """summarize-from-feedback nests its post under info and its two summaries in a list."""
    row = {
        "info": {"post": "My long post", "title": "t"},
        "summaries": [{"text": "A good summary"}, {"text": "bad"}],
        "choice": 1,
    }
    mapping = {"info.post": "prompt", "summaries.0.text": "response_a", "summaries.1.text": "response_b"}
    record = normalize_row({**row}, {**mapping, "choice": "preferred"}, {"0": "a", "1": "b"})
    assert (record["prompt"], record["chosen"], record["rejected"]) == (
        "My long post",
        "bad",
        "A good summary",
    )
    assert record["metadata"]["info"] == row["info"], "the nested column itself is kept"
    with pytest.raises(RowError, match="'response_b' is missing"):
        normalize_row(
            {**row, "summaries": row["summaries"][:1]}, {**mapping, "choice": "preferred"}, {"1": "b"}
        )


def test_a_nested_column_mapping_from_the_command_line_is_a_dotted_source():
    from alignflow.config import load_config

    config = load_config(
        None, ["data.column_mapping.question.full_text=prompt", "data.column_mapping.a=chosen"]
    )
    assert config.data.column_mapping == {"question.full_text": "prompt", "a": "chosen"}


def test_a_conversation_ending_with_the_assistant_is_a_prompt_up_to_the_last_user_turn():
    """SFT-style `messages` rows as a prompt set: generating after the reply would continue a
    finished exchange."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 plus 2?"},
        {"role": "assistant", "content": "4"},
    ]
    record = normalize_row({"messages": messages})
    assert record["kind"] == "prompt" and record["prompt"] == messages[:2]
    assert record["metadata"] == {"reference_completion": messages[2:]}
    open_ended = normalize_row({"messages": messages[:2], "topic": "math"})
    assert open_ended["prompt"] == messages[:2] and open_ended["metadata"] == {"topic": "math"}
    with pytest.raises(RowError, match="no turn before the assistant's"):
        normalize_row({"messages": messages[2:]})


def test_mt_bench_and_arena_hard_turns_read_one_turn_through_a_dotted_mapping(tmp_path):
    """MT-bench lists its user turns as texts, Arena-hard as role-less {content} records."""
    mt_bench = tmp_path / "mt_bench.jsonl"
    rows = [{"question_id": i, "turns": [f"Write a poem {i}.", "Now shorten it."]} for i in range(3)]
    mt_bench.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    whole = validate_paths(mt_bench, DataConfig(column_mapping={"turns": "prompt"}, max_bad_fraction=1.0))
    assert whole.report["counts_by_reason"] == {"bad_chat_structure": 3}
    assert "turns.0=prompt" in whole.issues[0].message and "2 turns without roles" in whole.issues[0].message
    first = validate_paths(mt_bench, DataConfig(column_mapping={"turns.0": "prompt"}))
    assert [e.record["prompt"] for e in first.kept] == [f"Write a poem {i}." for i in range(3)]

    arena = tmp_path / "arena_hard.jsonl"
    arena.write_text(
        json.dumps({"uid": "a1", "turns": [{"content": "Explain DNS."}]}) + "\n", encoding="utf-8"
    )
    read = validate_paths(arena, DataConfig(column_mapping={"turns.0.content": "prompt"}))
    assert read.kept[0].record["prompt"] == "Explain DNS." and read.kept[0].record["kind"] == "prompt"


def test_columns_named_but_for_case_get_the_mapping_that_reads_them(tmp_path):
    path = tmp_path / "capitalised.jsonl"
    row = {"Prompt": "Name a colour.", "Chosen ": "Blue.", "Rejected": "No.", "Source": "web"}
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    unread = validate_paths(path, DataConfig())
    message = unread.issues[0].message
    assert unread.issues[0].code == "unknown_shape" and not unread.kept
    hints = message.split("(map them: ")[1].rstrip(")").split(", ")
    assert hints == [
        "data.column_mapping.Chosen =chosen",
        "data.column_mapping.Prompt=prompt",
        "data.column_mapping.Rejected=rejected",
        "data.column_mapping.Source=source",
    ]
    mapping = dict(h.removeprefix("data.column_mapping.").split("=") for h in hints)
    read = validate_paths(path, DataConfig(column_mapping=mapping))
    record = read.kept[0].record
    assert (record["kind"], record["prompt"], record["chosen"], record["rejected"], record["source"]) == (
        "pair",
        "Name a colour.",
        "Blue.",
        "No.",
        "web",
    )


def test_columns_of_no_known_name_get_no_mapping_hint():
    with pytest.raises(RowError) as error:
        normalize_row({"title": "q", "body": "a"})
    assert "map them" not in str(error.value)
