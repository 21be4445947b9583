"""Tables and queries of the feedback service (SQLAlchemy 2; SQLite in WAL mode or PostgreSQL).

The schema is owned by the Alembic migrations in ``alignflow/service/migrations``; the ORM
classes here mirror it. Every write is its own short transaction so that an acknowledged
request is durable the moment the client sees its response.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    JSON,
    CursorResult,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class Base(DeclarativeBase):
    pass


class Feedback(Base):
    """One human judgement: a scored response or a chosen/rejected pair."""

    __tablename__ = "feedback"
    __table_args__ = (
        UniqueConstraint("agent_id", "idempotency_key", name="uq_feedback_idempotency"),
        Index("ix_feedback_agent_created", "agent_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    agent_id: Mapped[str] = mapped_column(String(64), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # scored | pairwise
    prompt: Mapped[str] = mapped_column(Text, nullable=False)
    response: Mapped[str | None] = mapped_column(Text)
    score: Mapped[float | None] = mapped_column(Float)
    chosen: Mapped[str | None] = mapped_column(Text)
    rejected: Mapped[str | None] = mapped_column(Text)
    run_id: Mapped[str | None] = mapped_column(String(200))
    notes: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class ApiToken(Base):
    """A bearer token, stored as its SHA-256 only; ``agents`` limits it to some agents."""

    __tablename__ = "api_tokens"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), nullable=False)
    agents: Mapped[list[str] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class Job(Base):
    """A training job: queued -> running -> trained | failed."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_agent_created", "agent_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    agent_id: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="queued")
    params: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    dataset_path: Mapped[str | None] = mapped_column(Text)
    feedback_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class Generation(Base):
    """A completion the service served: which policy version wrote it, on which arm, for whom."""

    __tablename__ = "generations"
    __table_args__ = (Index("ix_generations_agent_version", "agent_id", "policy_version"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)  # the runId
    agent_id: Mapped[str] = mapped_column(String(64), nullable=False)
    policy_version: Mapped[str] = mapped_column(String(32), nullable=False)
    arm: Mapped[str] = mapped_column(String(16), nullable=False)  # champion | challenger
    user_key: Mapped[str | None] = mapped_column(String(64))  # a hash of the caller's key, never the key
    prompt: Mapped[str] = mapped_column(Text, nullable=False)
    completion: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class TrafficSplit(Base):
    """The share of an agent's traffic the challenger gets (the champion serves the rest)."""

    __tablename__ = "traffic_splits"

    agent_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    challenger_share: Mapped[float] = mapped_column(Float, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


ACTIVE_JOB_STATES = ("queued", "running")


def hash_token(token: str) -> str:
    """Tokens are random and long, so one SHA-256 is enough to make the stored value useless."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def request_fingerprint(payload: dict[str, Any]) -> str:
    """A stable hash of a feedback body, to tell a retry from a different request with the same key."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _sqlite_pragmas(synchronous: str):
    def on_connect(dbapi_conn, _record) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


def make_engine(url: str, sqlite_synchronous: str = "NORMAL") -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and one connection per thread."""
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas(sqlite_synchronous))
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class IdempotencyConflict(Exception):
    """The idempotency key was already used for a different request body."""


@dataclass(frozen=True)
class FeedbackStats:
    count: int
    scored: int
    pairwise: int
    score_mean: float | None
    score_std: float | None


class Store:
    """The service's queries; one short session per call."""

    TOKEN_TTL_S = 1.0  # how long a token found in the database is trusted without asking again

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._tokens: dict[str, tuple[float, ApiToken]] = {}

    def session(self) -> Session:
        return self._sessions()

    # -- tokens ---------------------------------------------------------------------------
    def put_token(self, token: str, name: str = "default", agents: list[str] | None = None) -> None:
        """Install (or re-scope) a token; only its hash is written."""
        with self.session() as session, session.begin():
            row = session.get(ApiToken, hash_token(token))
            if row is None:
                session.add(ApiToken(token_hash=hash_token(token), name=name, agents=agents))
            else:
                row.name, row.agents = name, agents
        self._tokens.pop(hash_token(token), None)

    def find_token(self, token: str) -> ApiToken | None:
        """The token's row; a known token is remembered for TOKEN_TTL_S (a write path under load
        would otherwise read it once per request). Unknown tokens are never remembered."""
        key = hash_token(token)
        cached = self._tokens.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.TOKEN_TTL_S:
            return cached[1]
        with self.session() as session:
            row = session.get(ApiToken, key)
        if row is not None:
            self._tokens[key] = (time.monotonic(), row)
        return row

    # -- feedback -------------------------------------------------------------------------
    def add_feedback(
        self, agent_id: str, fields: dict[str, Any], idempotency_key: str | None
    ) -> tuple[Feedback, bool]:
        """Store one feedback row; returns (row, created). A replayed key returns the first row."""
        fingerprint = request_fingerprint({"agent_id": agent_id, **fields})
        if idempotency_key is not None:
            existing = self._by_key(agent_id, idempotency_key)
            if existing is not None:
                return self._replay(existing, fingerprint), False
        row = Feedback(
            id=new_id(),
            agent_id=agent_id,
            idempotency_key=idempotency_key,
            request_hash=fingerprint,
            created_at=utcnow(),
            **fields,
        )
        try:
            with self.session() as session, session.begin():
                session.add(row)
        except IntegrityError:
            # a concurrent retry with the same key won the race: answer with its row
            existing = self._by_key(agent_id, idempotency_key) if idempotency_key else None
            if existing is None:
                raise
            return self._replay(existing, fingerprint), False
        return row, True

    @staticmethod
    def _replay(existing: Feedback, fingerprint: str) -> Feedback:
        if existing.request_hash != fingerprint:
            raise IdempotencyConflict(existing.idempotency_key)
        return existing

    def add_feedback_batch(
        self, requests: list[tuple[str, dict[str, Any], str | None]]
    ) -> list[tuple[Feedback, bool] | Exception]:
        """Many feedback rows in ONE transaction (group commit), with add_feedback's idempotency.

        Returns per request (row, created), or the IdempotencyConflict to raise for it; all
        rows are committed when this returns. A unique-key race with another process
        (IntegrityError) fails the whole transaction: the caller falls back to add_feedback.
        """
        results: list[tuple[Feedback, bool] | Exception] = []
        rows: list[dict[str, Any]] = []
        with self.session() as session, session.begin():
            keyed: dict[str, set[str]] = {}
            for agent_id, _, key in requests:
                if key is not None:
                    keyed.setdefault(agent_id, set()).add(key)
            # the key is typed as optional on the row; the rows read here all have one (the IN filter)
            existing: dict[tuple[str, str | None], Feedback] = {}
            for agent_id, keys in keyed.items():
                mine = (Feedback.agent_id == agent_id, Feedback.idempotency_key.in_(keys))
                stmt = select(Feedback).where(*mine)
                existing.update({(agent_id, row.idempotency_key): row for row in session.scalars(stmt)})
            for agent_id, fields, key in requests:
                fingerprint = request_fingerprint({"agent_id": agent_id, **fields})
                first = existing.get((agent_id, key)) if key is not None else None
                if first is not None:
                    try:
                        results.append((self._replay(first, fingerprint), False))
                    except IdempotencyConflict as exc:
                        results.append(exc)
                    continue
                values = {
                    "id": new_id(),
                    "agent_id": agent_id,
                    "idempotency_key": key,
                    "request_hash": fingerprint,
                    "created_at": utcnow(),
                    **fields,
                }
                row = Feedback(**values)
                if key is not None:  # a second request with this key in the same batch replays it
                    existing[(agent_id, key)] = row
                rows.append(values)
                results.append((row, True))
            if rows:
                session.execute(insert(Feedback), rows)
        return results

    def _by_key(self, agent_id: str, key: str) -> Feedback | None:
        with self.session() as session:
            stmt = select(Feedback).where(Feedback.agent_id == agent_id, Feedback.idempotency_key == key)
            return session.scalars(stmt).first()

    def feedback_stats(self, agent_id: str) -> FeedbackStats:
        """Counts and score moments, computed in Python so SQLite and PostgreSQL agree exactly."""
        with self.session() as session:
            kinds = dict(
                session.execute(
                    select(Feedback.kind, func.count())
                    .where(Feedback.agent_id == agent_id)
                    .group_by(Feedback.kind)
                ).all()
            )
            # the column is nullable (pairwise rows), but a "scored" row always has a score
            scores = cast(
                Sequence[float],
                session.scalars(
                    select(Feedback.score).where(Feedback.agent_id == agent_id, Feedback.kind == "scored")
                ).all(),
            )
        mean = std = None
        if scores:
            mean = sum(scores) / len(scores)
            std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        scored, pairwise = kinds.get("scored", 0), kinds.get("pairwise", 0)
        return FeedbackStats(scored + pairwise, scored, pairwise, mean, std)

    def iter_feedback(self, agent_id: str, batch: int = 1000) -> Iterator[Feedback]:
        """The agent's feedback in insertion order, streamed in batches."""
        with self.session() as session:
            stmt = (
                select(Feedback)
                .where(Feedback.agent_id == agent_id)
                .order_by(Feedback.created_at, Feedback.id)
                .execution_options(yield_per=batch)
            )
            yield from session.scalars(stmt)

    def count_feedback(self, agent_id: str | None = None) -> int:
        with self.session() as session:
            stmt = select(func.count()).select_from(Feedback)
            if agent_id is not None:
                stmt = stmt.where(Feedback.agent_id == agent_id)
            return session.scalar(stmt) or 0

    # -- jobs -----------------------------------------------------------------------------
    def create_job(self, agent_id: str, params: dict[str, Any], feedback_count: int) -> Job:
        job = Job(
            id=new_id(),
            agent_id=agent_id,
            status="queued",
            params=params,
            feedback_count=feedback_count,
            created_at=utcnow(),
            updated_at=utcnow(),
        )
        with self.session() as session, session.begin():
            session.add(job)
        return job

    def get_job(self, job_id: str) -> Job | None:
        with self.session() as session:
            return session.get(Job, job_id)

    def active_job(self, agent_id: str) -> Job | None:
        """The agent's queued or running job, if any (one at a time per agent)."""
        with self.session() as session:
            stmt = select(Job).where(Job.agent_id == agent_id, Job.status.in_(ACTIVE_JOB_STATES))
            return session.scalars(stmt.order_by(Job.created_at.desc())).first()

    def update_job(self, job_id: str, expect_status: str | None = None, **values: Any) -> bool:
        """Update a job; with ``expect_status`` only while it still has it. Returns whether it did."""
        stmt = update(Job).where(Job.id == job_id)
        if expect_status is not None:
            stmt = stmt.where(Job.status == expect_status)
        with self.session() as session, session.begin():
            # an UPDATE's result is a CursorResult (with rowcount); execute() is typed as the generic Result
            result = cast("CursorResult[Any]", session.execute(stmt.values(updated_at=utcnow(), **values)))
            return (result.rowcount or 0) > 0

    def fail_abandoned_jobs(self, reason: str) -> int:
        """Jobs left queued/running by a previous process can never finish: mark them failed."""
        with self.session() as session, session.begin():
            result = cast(  # an UPDATE's result is a CursorResult, typed by execute() as a plain Result
                "CursorResult[Any]",
                session.execute(
                    update(Job)
                    .where(Job.status.in_(ACTIVE_JOB_STATES))
                    .values(status="failed", error=reason, updated_at=utcnow())
                ),
            )
            return result.rowcount or 0

    # -- serving and A/B ------------------------------------------------------------------
    def add_generation(
        self, agent_id: str, policy_version: str, arm: str, user_key: str | None, prompt: str, completion: str
    ) -> Generation:
        row = Generation(
            id=new_id(),
            agent_id=agent_id,
            policy_version=policy_version,
            arm=arm,
            user_key=user_key,
            prompt=prompt,
            completion=completion,
            created_at=utcnow(),
        )
        with self.session() as session, session.begin():
            session.add(row)
        return row

    def served_versions(self, agent_id: str) -> dict[str, str]:
        """run id -> the policy version that wrote it, for every completion served to the agent."""
        with self.session() as session:
            rows = session.execute(
                select(Generation.id, Generation.policy_version).where(Generation.agent_id == agent_id)
            ).all()
        return dict(rows)

    def online_scores(self, agent_id: str) -> dict[str, list[float]]:
        """Ratings of served completions, by the policy version that wrote them."""
        with self.session() as session:
            rows = session.execute(
                select(Generation.policy_version, Feedback.score)
                .join(Feedback, Feedback.run_id == Generation.id)
                .where(
                    Generation.agent_id == agent_id,
                    Feedback.agent_id == agent_id,
                    Feedback.kind == "scored",
                )
                .order_by(Feedback.created_at, Feedback.id)
            ).all()
        scores: dict[str, list[float]] = {}
        for version, score in rows:
            assert score is not None  # a "scored" row always has a score
            scores.setdefault(version, []).append(float(score))
        return scores

    def traffic_split(self, agent_id: str) -> TrafficSplit | None:
        with self.session() as session:
            return session.get(TrafficSplit, agent_id)

    def challenger_share(self, agent_id: str) -> float:
        """The challenger's share of traffic; 0 (all champion) until someone sets one."""
        row = self.traffic_split(agent_id)
        return row.challenger_share if row is not None else 0.0

    def set_challenger_share(self, agent_id: str, share: float) -> TrafficSplit:
        with self.session() as session, session.begin():
            row = session.get(TrafficSplit, agent_id)
            if row is None:
                row = TrafficSplit(agent_id=agent_id, challenger_share=share, updated_at=utcnow())
                session.add(row)
            else:
                row.challenger_share, row.updated_at = share, utcnow()
        return row


_STOP = object()


class FeedbackWriter:
    """Group commit for feedback: one thread writes whatever is waiting in one transaction.

    Under load many requests arrive while a commit runs; the next transaction takes them
    all, so the database sees one commit per batch instead of per request (and SQLite no
    lock queue of request threads). Each request's future resolves only after the commit
    that holds its row, so an acknowledgement still means the row is durable, exactly as
    with one transaction per request. Idempotency is :meth:`Store.add_feedback_batch`'s.
    """

    def __init__(self, store: Store, max_batch: int = 256):
        self.store, self.max_batch = store, max_batch
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="alignflow-feedback-writer", daemon=True)
        self._thread.start()

    def submit(self, agent_id: str, fields: dict[str, Any], idempotency_key: str | None) -> Future:
        """A future of (row, created), or of IdempotencyConflict."""
        future: Future = Future()
        self._queue.put((future, (agent_id, fields, idempotency_key)))
        return future

    def close(self, timeout: float = 30.0) -> None:
        """Write what is waiting, then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                batch.append(more)
            self._write(batch)
            if stop:
                return

    def _write(self, batch: list[tuple[Future, tuple]]) -> None:
        try:
            results = self.store.add_feedback_batch([request for _, request in batch])
        except Exception:  # noqa: BLE001 - e.g. a key race with another process: one by one
            log.debug("group commit of %d feedback rows failed; writing them one by one", len(batch))
            for future, request in batch:
                try:
                    future.set_result(self.store.add_feedback(*request))
                except Exception as exc:  # noqa: BLE001 - handed to the waiting request
                    future.set_exception(exc)
            return
        for (future, _), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
