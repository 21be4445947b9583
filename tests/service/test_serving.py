"""PolicyPool: versions loaded once, concurrent prompts merged into batched ``generate`` calls.

One real tiny model per module: built offline on demo texts, its weights redrawn large so
that greedy decoding writes 16 tokens that differ from prompt to prompt (the untrained
model repeats one token for every prompt, which would make "batched == one by one" vacuous).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import mlflow
import pytest
from fastapi import FastAPI
from mlflow import MlflowClient

from alignflow.data.demo import iter_demo_pairs
from alignflow.models import load_causal_lm
from alignflow.models.prompting import generate as real_generate
from alignflow.service.serving import PolicyNotFound, PolicyPool, PoolClosed, PromptTooLong

NAME, TOKENS = "agent-policy", 16
PROMPTS = [r["prompt"] for r in iter_demo_pairs(24, seed=7, phrasings=6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The bench's policy: the demo's tiny model, redrawn so greedy decoding writes every token."""
    from bench.generate_bench import build_policy

    return build_policy(tmp_path_factory.mktemp("serving-model"))[0]


@pytest.fixture(scope="module")
def solo(model_dir) -> dict[str, str]:
    """Each prompt's completion from its own ``generate`` call: the reference."""
    model, tokenizer = load_causal_lm(model_dir)
    return {p: real_generate(model, tokenizer, [p], max_new_tokens=TOKENS)[0] for p in PROMPTS}


class Spy:
    """Wraps ``prompting.generate``: records each call's batch size; can fail the next call."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.fail_next: Exception | None = None

    def __call__(self, model, tokenizer, prompts, **kwargs):
        self.batches.append(len(prompts))
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return real_generate(model, tokenizer, prompts, **kwargs)


def _pool(tmp_path: Path, spy: Spy, **kwargs) -> PolicyPool:
    return PolicyPool(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "cache", generate_fn=spy, **kwargs)


async def _all(pool: PolicyPool, prompts: list[str], name: str = NAME, version: str = "1") -> list[str]:
    return await asyncio.gather(*(pool.generate(name, version, p) for p in prompts))


def test_concurrent_callers_share_batched_generate_calls(tmp_path, model_dir, solo):
    spy = Spy()
    pool = _pool(tmp_path, spy, max_new_tokens=TOKENS, max_batch=32, max_wait_ms=50)
    pool.add_local(NAME, "1", model_dir)
    try:
        completions = asyncio.run(_all(pool, PROMPTS))
    finally:
        pool.close()
    assert completions == [solo[p] for p in PROMPTS]  # each caller gets its own completion
    assert len(set(completions)) > len(PROMPTS) // 2  # and they differ: the check is not vacuous
    assert sum(spy.batches) == len(PROMPTS)
    assert len(spy.batches) <= 2, spy.batches  # 24 callers, one (at most two) generate calls


def test_batched_completions_equal_one_by_one(tmp_path, model_dir):
    results, spies = {}, {}
    for batching in (True, False):
        spies[batching] = Spy()
        pool = _pool(tmp_path, spies[batching], max_new_tokens=TOKENS, max_batch=8, batching=batching)
        pool.add_local(NAME, "1", model_dir)
        try:
            results[batching] = asyncio.run(_all(pool, PROMPTS))
        finally:
            pool.close()
    assert results[True] == results[False]
    assert max(spies[True].batches) > 1 and max(spies[True].batches) <= 8
    assert spies[False].batches == [1] * len(PROMPTS)  # one-by-one: a generate call per request


def test_registered_version_is_downloaded_and_loaded_once_under_concurrent_first_requests(
    tmp_path, model_dir, solo, monkeypatch
):
    import alignflow.models.factory as factory
    import alignflow.registry.models as registry_models

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        logged = registry_models.log_model(model_dir, uri, NAME, name="policy")
    assert logged.version == "1"

    calls = {"download": 0, "load": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        registry_models, "download_model_dir", counted("download", registry_models.download_model_dir)
    )
    monkeypatch.setattr(factory, "load_causal_lm", counted("load", factory.load_causal_lm))
    spy = Spy()
    pool = PolicyPool(uri, tmp_path / "cache", max_new_tokens=TOKENS, max_wait_ms=20, generate_fn=spy)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(20)]
    try:
        assert pool.loaded() == []
        completions = asyncio.run(_all(pool, prompts))
        assert calls == {"download": 1, "load": 1}
        assert pool.loaded() == [(NAME, "1")] and pool.load_count(NAME, "1") == 1
        assert completions == [solo[p] for p in prompts]  # the registry's copy is the same model
        assert sum(spy.batches) == 20 and len(spy.batches) < 20
        with pytest.raises(PolicyNotFound):
            asyncio.run(pool.generate(NAME, "7", PROMPTS[0]))
        with pytest.raises(PolicyNotFound):
            asyncio.run(pool.generate("no-such-policy", "1", PROMPTS[0]))
    finally:
        pool.close()
    assert calls == {"download": 3, "load": 1}  # the two unknown versions were asked for too
    # a later pool on the same cache folder (a restarted service) loads without downloading
    again = PolicyPool(uri, tmp_path / "cache", max_new_tokens=TOKENS)
    try:
        assert asyncio.run(again.generate(NAME, "1", PROMPTS[0])) == solo[PROMPTS[0]]
    finally:
        again.close()
    assert calls == {"download": 3, "load": 2}


def test_a_failing_batch_fails_its_callers_and_the_worker_keeps_serving(tmp_path, model_dir, solo):
    spy = Spy()
    pool = _pool(tmp_path, spy, max_new_tokens=TOKENS, max_wait_ms=50)
    pool.add_local(NAME, "1", model_dir)

    async def scenario():
        await pool.generate(NAME, "1", PROMPTS[0])  # loaded and warm
        spy.fail_next = RuntimeError("CUDA out of memory (simulated)")
        failed = await asyncio.gather(
            *(pool.generate(NAME, "1", p) for p in PROMPTS[:6]), return_exceptions=True
        )
        after = await _all(pool, PROMPTS[6:10])
        return failed, after

    try:
        failed, after = asyncio.run(scenario())
        stats = pool.stats()[(NAME, "1")]
    finally:
        pool.close()
    assert spy.batches[1] == 6  # the six callers were one batch
    assert all(isinstance(e, RuntimeError) and "out of memory" in str(e) for e in failed)
    assert after == [solo[p] for p in PROMPTS[6:10]]
    assert stats.failed_calls == 1 and stats.failed_requests == 6 and stats.requests == 5


def test_too_long_prompt_fails_alone_and_its_batch_is_served(tmp_path, model_dir, solo):
    spy = Spy()
    pool = _pool(tmp_path, spy, max_new_tokens=TOKENS, max_wait_ms=50)
    pool.add_local(NAME, "1", model_dir)
    prompts = [PROMPTS[0], "one two three " * 200, PROMPTS[1]]
    try:
        got = asyncio.run(_gather_exceptions(pool, prompts))
    finally:
        pool.close()
    assert got[0] == solo[PROMPTS[0]] and got[2] == solo[PROMPTS[1]]
    assert isinstance(got[1], PromptTooLong) and "context 256" in str(got[1])
    assert spy.batches == [2]


async def _gather_exceptions(pool: PolicyPool, prompts: list[str]) -> list:
    return await asyncio.gather(*(pool.generate(NAME, "1", p) for p in prompts), return_exceptions=True)


def test_fastapi_endpoints_on_one_event_loop_are_batched(tmp_path, model_dir, solo):
    spy = Spy()
    pool = _pool(tmp_path, spy, max_new_tokens=TOKENS, max_wait_ms=50)
    pool.add_local(NAME, "1", model_dir)
    app = FastAPI()

    @app.post("/generate")
    async def generate(body: dict) -> dict:
        return {"completion": await pool.generate(NAME, "1", body["prompt"])}

    async def clients():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serving") as client:
            responses = await asyncio.gather(
                *(client.post("/generate", json={"prompt": p}) for p in PROMPTS[:12])
            )
        return [r.json()["completion"] for r in responses]

    try:
        assert asyncio.run(clients()) == [solo[p] for p in PROMPTS[:12]]
    finally:
        pool.close()
    assert sum(spy.batches) == 12 and len(spy.batches) <= 2


def test_least_recently_used_version_is_unloaded_and_reloads_on_demand(tmp_path, model_dir, solo):
    pool = _pool(tmp_path, Spy(), max_new_tokens=TOKENS, max_models=1)
    pool.add_local(NAME, "1", model_dir)
    pool.add_local(NAME, "2", model_dir)
    try:
        assert asyncio.run(pool.generate(NAME, "1", PROMPTS[0])) == solo[PROMPTS[0]]
        assert asyncio.run(pool.generate(NAME, "2", PROMPTS[1])) == solo[PROMPTS[1]]
        assert pool.loaded() == [(NAME, "2")]
        assert asyncio.run(pool.generate(NAME, "1", PROMPTS[2])) == solo[PROMPTS[2]]
        assert pool.loaded() == [(NAME, "1")] and pool.load_count(NAME, "1") == 2
    finally:
        pool.close()


def test_close_fails_waiting_callers_and_later_requests(tmp_path, model_dir):
    release = threading.Event()
    spy = Spy()

    def slow(model, tokenizer, prompts, **kwargs):
        release.wait(10)
        return spy(model, tokenizer, prompts, **kwargs)

    pool = PolicyPool(
        f"sqlite:///{tmp_path}/m.db", tmp_path / "cache", max_new_tokens=4, max_batch=1, generate_fn=slow
    )
    pool.add_local(NAME, "1", model_dir)

    async def scenario():
        tasks = [asyncio.create_task(pool.generate(NAME, "1", p)) for p in PROMPTS[:3]]
        while not pool.loaded():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the first request is inside generate, two are queued
        closing = asyncio.create_task(asyncio.to_thread(pool.close))
        await asyncio.sleep(0.1)
        release.set()
        await closing
        return await asyncio.gather(*tasks, return_exceptions=True)

    first, *queued = asyncio.run(scenario())
    assert isinstance(first, str)  # the batch under way finishes
    assert all(isinstance(e, PoolClosed) for e in queued)
    with pytest.raises(PoolClosed):
        asyncio.run(pool.generate(NAME, "1", PROMPTS[0]))
    assert pool.loaded() == []
