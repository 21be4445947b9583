from alignflow.data.snapshot import load_split, write_split


def test_round_trip_keeps_text_messages_and_metadata(tmp_path):
    records = [
        {"id": "a", "kind": "pair", "prompt": "p", "chosen": "c", "rejected": "r", "metadata": {"answer": 3}},
        {
            "id": "b",
            "kind": "pair",
            "prompt": [{"role": "user", "content": "hi"}],
            "chosen": [{"role": "assistant", "content": "hello"}],
            "rejected": [{"role": "assistant", "content": "go away"}],
        },
        {"id": "c", "kind": "scored", "prompt": "p", "completion": "x", "score": 0.25},
    ]
    write_split(tmp_path, "train", records)
    back = load_split(tmp_path, "train")
    assert back[0]["metadata"] == {"answer": 3} and back[0]["chosen"] == "c"
    assert back[1]["chosen"] == [{"role": "assistant", "content": "hello"}]
    assert back[2]["score"] == 0.25 and "chosen" not in back[2]
    assert [r["id"] for r in load_split(tmp_path, "train", kind="scored")] == ["c"]
