"""The load bench's own check: a lost, altered or doubled write must show in its counts."""

from __future__ import annotations

import sqlite3

from bench.feedback_load_bench import _body, _verify


def _store(db, rows):
    conn = sqlite3.connect(db)
    conn.execute(
        "CREATE TABLE feedback (id TEXT, agent_id TEXT, prompt TEXT, response TEXT, score REAL, "
        "run_id TEXT, idempotency_key TEXT)"
    )
    for row_id, key, body in rows:
        conn.execute(
            "INSERT INTO feedback VALUES (?, 'a', ?, ?, ?, ?, ?)",
            (row_id, body["prompt"], body["response"], body["score"], body["runId"], key),
        )
    conn.commit()
    conn.close()


def test_a_clean_run_passes(tmp_path):
    db = tmp_path / "f.db"
    keys = ["p-t0-1", "p-t0-2", "p-t1-1"]
    _store(db, [(f"id{i}", k, _body(k)) for i, k in enumerate(keys)])
    check = _verify(f"sqlite:///{db}", {f"id{i}": f"id{i}" for i in range(3)}, "a")
    assert check == {
        "rows_in_db": 3,
        "acknowledged_missing": 0,
        "content_mismatches": 0,
        "duplicate_keys": 0,
        "all_acknowledged_present": True,
    }


def test_lost_altered_and_doubled_writes_are_counted(tmp_path):
    db = tmp_path / "f.db"
    altered = dict(_body("p-t0-2"), score=0.99)
    _store(
        db,
        [("id0", "p-t0-1", _body("p-t0-1")), ("id1", "p-t0-2", altered), ("id2", "p-t0-1", _body("p-t0-1"))],
    )
    check = _verify(f"sqlite:///{db}", {"id0": "id0", "id1": "id1", "lost": "lost"}, "a")
    assert check["acknowledged_missing"] == 1
    assert check["content_mismatches"] == 1
    assert check["duplicate_keys"] == 1
    assert not check["all_acknowledged_present"]


def test_python_and_wrk_requests_rebuild_the_body_they_sent():
    assert _body(7) == _body("7")
    assert _body("ceiling-50-t1-123")["response"] == f"The answer is {123 % 10 + 123 // 10 % 10}."
    assert _body("ceiling-50-t1-123")["runId"] == "bench-run-ceiling-50-t1-123"
