"""Group commit of feedback writes: one transaction for many requests, the same answers.

Each acknowledgement must mean the row is committed (a fresh connection sees it), a key
replays its first row, a key reused with another body is a conflict, and a failed group
falls back to one transaction per request. Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from alignflow.service.migrate import upgrade_database
from alignflow.service.storage import FeedbackWriter, IdempotencyConflict, Store, make_engine


def scored(i: int) -> dict:
    return {"kind": "scored", "prompt": f"prompt {i}", "response": f"answer {i}", "score": (i % 11) / 10}


@pytest.fixture
def store(database_url):
    engine = make_engine(database_url)
    upgrade_database(engine)
    yield Store(engine)
    engine.dispose()


def held_writer(store: Store) -> tuple[FeedbackWriter, threading.Event, list[int]]:
    """A writer whose first group waits for ``release``, so later requests queue up behind it."""
    release, sizes = threading.Event(), []
    batch = store.add_feedback_batch

    def counted(requests):
        release.wait(10)
        sizes.append(len(requests))
        return batch(requests)

    store.add_feedback_batch = counted
    return FeedbackWriter(store), release, sizes


def test_waiting_requests_share_one_commit_and_are_committed_when_acknowledged(store, database_url):
    writer, release, sizes = held_writer(store)
    futures = [writer.submit("agent-a", scored(i), f"key-{i}") for i in range(60)]
    release.set()
    answers = [f.result(10) for f in futures]
    writer.close()
    assert all(created for _, created in answers)
    assert len(sizes) <= 3 and sum(sizes) == 60, sizes  # one held group, then the rest together
    fresh = sa.create_engine(database_url)
    with fresh.connect() as conn:
        stored = dict(
            conn.execute(sa.text("SELECT id, prompt FROM feedback WHERE agent_id = 'agent-a'")).all()
        )
    fresh.dispose()
    assert {row.id: row.prompt for row, _ in answers} == stored


def test_a_key_in_one_group_is_stored_once_and_replayed(store):
    writer, release, _ = held_writer(store)
    first = writer.submit("agent-b", scored(1), "same-key")
    again = [writer.submit("agent-b", scored(1), "same-key") for _ in range(5)]
    conflict = writer.submit("agent-b", scored(2), "same-key")
    other_agent = writer.submit("agent-c", scored(1), "same-key")
    unkeyed = [writer.submit("agent-b", scored(3), None) for _ in range(2)]
    release.set()
    row, created = first.result(10)
    assert created
    assert all(
        f.result(10) == (row, False) or (f.result(10)[0].id, f.result(10)[1]) == (row.id, False)
        for f in again
    )
    with pytest.raises(IdempotencyConflict):
        conflict.result(10)
    assert other_agent.result(10)[1] is True
    assert [f.result(10)[1] for f in unkeyed] == [True, True]  # no key: every post is a new row
    writer.close()
    assert store.count_feedback("agent-b") == 3 and store.count_feedback("agent-c") == 1


def test_a_key_stored_earlier_is_replayed_by_a_later_group(store):
    writer = FeedbackWriter(store)
    row, created = writer.submit("agent-d", scored(4), "k").result(10)
    replay = writer.submit("agent-d", scored(4), "k").result(10)
    writer.close()
    assert created and replay[0].id == row.id and replay[1] is False
    assert store.count_feedback("agent-d") == 1


def test_a_failed_group_falls_back_to_one_transaction_per_request(store):
    def racing(_requests):
        raise IntegrityError("INSERT", {}, Exception("another process stored this key first"))

    store.add_feedback_batch = racing
    writer = FeedbackWriter(store)
    answers = [writer.submit("agent-e", scored(i), f"k{i}").result(10) for i in range(3)]
    writer.close()
    assert [created for _, created in answers] == [True, True, True]
    assert store.count_feedback("agent-e") == 3


def test_many_threads_many_keys_no_loss_no_double(store):
    writer = FeedbackWriter(store)
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(
                lambda i: writer.submit("agent-f", scored(i % 100), f"k{i % 100}").result(10), range(300)
            )
        )
    writer.close()
    assert sum(created for _, created in answers) == 100
    ids = {}
    for i, (row, _) in enumerate(answers):
        ids.setdefault(i % 100, set()).add(row.id)
    assert all(len(v) == 1 for v in ids.values())
    assert store.count_feedback("agent-f") == 100
