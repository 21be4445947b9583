"""Policy serving for A/B: registered versions loaded once and kept, concurrent prompts batched.

:class:`PolicyPool` holds a few policy versions in memory (least recently used first out).
A version is fetched from the MLflow registry once (``download_model_dir`` into the pool's
cache folder, reused by later pools on the same folder) and loaded once, however many
requests arrive together. Each loaded version has one worker thread: it takes up to
``max_batch`` queued prompts, waiting at most ``max_wait_ms`` after the first of them
arrived, and answers them with ONE left-padded greedy
:func:`alignflow.models.prompting.generate` call. Greedy decoding with left padding makes a
batched completion the same as the completion of that prompt on its own. With
``batching=False`` the worker runs one ``generate`` call per request (the baseline).

The worker thread does the model work (torch releases the GIL) and hands each result back
to the caller's event loop with ``call_soon_threadsafe``, so any event loop can await
:meth:`PolicyPool.generate`: FastAPI's, ``asyncio.run``'s, a test client's. Importing this
module is cheap (no torch): the service builds a pool for every app.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import queue
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (registered model name, version number)
GenerateFn = Callable[..., list[str]]  # prompting.generate's signature
_STOP = object()  # sentinel: the worker finishes what it holds and exits


class PolicyNotFound(LookupError):
    """The registry has no such model version (the service answers 404)."""


class PromptTooLong(ValueError):
    """Prompt + ``max_new_tokens`` exceed the model's context (the service answers 422)."""


class PoolClosed(RuntimeError):
    """The pool was closed before the request was answered."""


@dataclass
class ServingStats:
    """What one loaded version's worker has done since it was loaded."""

    requests: int = 0  # answered with a completion
    generate_calls: int = 0  # batches run (each one ``generate`` call), failed ones included
    failed_calls: int = 0
    failed_requests: int = 0  # callers that got a generation error
    rejected: int = 0  # prompts refused before generation (too long)
    cancelled: int = 0  # callers gone before their batch ran
    max_batch_seen: int = 0
    generate_s: float = 0.0  # seconds inside ``generate``

    @property
    def mean_batch(self) -> float:
        done = self.requests + self.failed_requests
        return done / self.generate_calls if self.generate_calls else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean_batch": round(self.mean_batch, 3)}


class _Request:
    """One caller's prompt and the future its event loop awaits."""

    __slots__ = ("future", "loop", "prompt", "queued_at")

    def __init__(self, prompt: str, loop: asyncio.AbstractEventLoop) -> None:
        self.prompt = prompt
        self.loop = loop
        self.future: asyncio.Future[str] = loop.create_future()
        self.queued_at = time.monotonic()

    def gone(self) -> bool:
        return self.future.done()  # cancelled by its caller (disconnect, timeout)

    def resolve(self, text: str) -> None:
        self._hand_back(_set_result, text)

    def fail(self, exc: BaseException) -> None:
        self._hand_back(_set_exception, exc)

    def _hand_back(self, setter: Callable[[asyncio.Future, Any], None], value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(setter, self.future, value)


def _set_result(future: asyncio.Future, value: str) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class _Policy:
    """One loaded version, its request queue and the worker thread that batches it."""

    def __init__(
        self,
        key: Key,
        model: Any,
        tokenizer: Any,
        generate_fn: GenerateFn,
        max_new_tokens: int,
        max_batch: int,
        max_wait_s: float,
    ) -> None:
        self.key, self.model, self.tokenizer = key, model, tokenizer
        self.generate_fn = generate_fn
        self.max_new_tokens, self.max_batch, self.max_wait_s = max_new_tokens, max_batch, max_wait_s
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_prompt_tokens = context - max_new_tokens if isinstance(context, int) else None
        self.stats = ServingStats()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._abort: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"policy-{key[0]}-v{key[1]}", daemon=True)
        self._thread.start()

    def submit(self, request: _Request) -> bool:
        """Queue ``request``; False when this version was closed (evicted) meanwhile."""
        with self._lock:
            if self._closed:
                return False
            self._queue.put(request)
            return True

    def close(self, abort: BaseException | None = None, timeout: float | None = 30.0) -> None:
        """Stop the worker: queued requests are answered first, or failed with ``abort``."""
        with self._lock:
            if self._closed:
                return
            self._closed, self._abort = True, abort
            self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the worker thread --------------------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            deadline = first.queued_at + self.max_wait_s
            while len(batch) < self.max_batch:
                wait = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            if self._abort is not None:
                for request in batch:
                    request.fail(self._abort)
                continue
            try:
                self._serve(batch)
            except Exception as exc:  # a bug outside generate: fail the batch, keep the worker
                log.exception("serving a batch of %s v%s failed", *self.key)
                for request in batch:
                    request.fail(exc)

    def _serve(self, batch: list[_Request]) -> None:
        live = []
        for request in batch:
            if request.gone():
                self.stats.cancelled += 1
            elif (reason := self._too_long(request.prompt)) is not None:
                self.stats.rejected += 1
                request.fail(PromptTooLong(reason))
            else:
                live.append(request)
        if not live:
            return
        started = time.perf_counter()
        self.stats.generate_calls += 1
        try:
            texts = self.generate_fn(
                self.model,
                self.tokenizer,
                [r.prompt for r in live],
                max_new_tokens=self.max_new_tokens,
                batch_size=len(live),
            )
            if len(texts) != len(live):
                raise RuntimeError(f"generate returned {len(texts)} completions for {len(live)} prompts")
        except Exception as exc:  # every caller of this batch hears of it; the worker goes on
            self.stats.failed_calls += 1
            self.stats.failed_requests += len(live)
            log.warning("generation failed for %s v%s (%d prompts): %r", *self.key, len(live), exc)
            for request in live:
                request.fail(exc)
            return
        finally:
            self.stats.generate_s += time.perf_counter() - started
        self.stats.requests += len(live)
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(live))
        for request, text in zip(live, texts, strict=True):
            request.resolve(text)

    def _too_long(self, prompt: str) -> str | None:
        if self.max_prompt_tokens is None:
            return None
        from alignflow.models.prompting import format_prompt

        n = len(self.tokenizer(format_prompt(self.tokenizer, prompt), add_special_tokens=False)["input_ids"])
        if n <= self.max_prompt_tokens:
            return None
        return (
            f"prompt is {n} tokens; {self.key[0]} v{self.key[1]} takes at most {self.max_prompt_tokens} "
            f"(context {self.max_prompt_tokens + self.max_new_tokens} - {self.max_new_tokens} new tokens)"
        )


def _local_source(tracking_uri: str, name: str, version: str) -> Path | None:
    """The version's source when it is a saved model folder on this machine, else None."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        source = MlflowClient(tracking_uri).get_model_version(name, version).source
    except MlflowException:
        return None
    path = Path(source) if source and "://" not in source and not source.startswith("models:") else None
    return path if path is not None and (path / "config.json").exists() else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


class PolicyPool:
    """Registered policy versions loaded once and kept; concurrent prompts to one version are batched.

    ``generate`` is awaitable from any event loop by many concurrent callers. A version is
    a registered MLflow model version (``model_name``, version number as a string) or a
    local folder / loaded model given to :meth:`add_local`. At most ``max_models`` versions
    stay loaded; the least recently used one is dropped (after answering its queue) when
    another is needed. ``device``: where models run (default: CUDA when available).
    ``generate_fn`` replaces :func:`alignflow.models.prompting.generate` (same signature).
    """

    def __init__(
        self,
        tracking_uri: str,
        cache_dir: Path,
        max_new_tokens: int = 32,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        batching: bool = True,
        *,
        max_models: int = 4,
        device: str | None = None,
        generate_fn: GenerateFn | None = None,
    ) -> None:
        if max_new_tokens < 1 or max_batch < 1 or max_wait_ms < 0 or max_models < 1:
            raise ValueError("max_new_tokens, max_batch and max_models must be >= 1, max_wait_ms >= 0")
        self.tracking_uri = tracking_uri
        self.cache_dir = Path(cache_dir)
        self.max_new_tokens = max_new_tokens
        self.max_batch = max_batch if batching else 1
        self.max_wait_ms = max_wait_ms if batching else 0.0
        self.batching = batching
        self.max_models = max_models
        self.device = device
        self._generate_fn = generate_fn
        self._lock = threading.Lock()
        self._policies: OrderedDict[Key, _Policy] = OrderedDict()
        self._loading: dict[Key, Future] = {}
        self._local: dict[Key, Path | tuple[Any, Any]] = {}
        self._load_counts: dict[Key, int] = {}
        self._closed = False

    # -- public API ---------------------------------------------------------------------

    async def generate(self, model_name: str, version: str, prompt: str) -> str:
        """The greedy completion of ``prompt`` by ``model_name`` v``version``.

        Raises :class:`PolicyNotFound` (no such registered version), :class:`PromptTooLong`,
        :class:`PoolClosed`, or the error of the ``generate`` call that held this prompt.
        """
        key = (model_name, str(version))
        loop = asyncio.get_running_loop()
        while True:
            policy = await self._policy(key)
            request = _Request(prompt, loop)
            if policy.submit(request):
                return await request.future
            # evicted between lookup and submit: look it up (or load it) again

    def add_local(self, model_name: str, version: str, source: str | Path | tuple[Any, Any]) -> None:
        """Serve ``source`` (a saved model folder, or a loaded ``(model, tokenizer)``) as that version.

        Nothing is loaded until the first request; a version already loaded is replaced.
        """
        key = (model_name, str(version))
        with self._lock:
            self._local[key] = source if isinstance(source, tuple) else Path(source)
            stale = self._policies.pop(key, None)
        if stale is not None:
            stale.close()

    def loaded(self) -> list[tuple[str, str]]:
        """(model_name, version) pairs currently held, least recently used first."""
        with self._lock:
            return list(self._policies)

    def stats(self) -> dict[tuple[str, str], ServingStats]:
        """Per loaded version: requests, ``generate`` calls, mean batch size, failures."""
        with self._lock:
            return {key: ServingStats(**asdict(p.stats)) for key, p in self._policies.items()}

    def load_count(self, model_name: str, version: str) -> int:
        """How many times this pool has loaded that version (1 unless it was evicted)."""
        return self._load_counts.get((model_name, str(version)), 0)

    def close(self) -> None:
        """Fail what is queued with :class:`PoolClosed`, stop the workers, drop the models."""
        with self._lock:
            self._closed = True
            policies = list(self._policies.values())
            self._policies.clear()
        for policy in policies:
            policy.close(abort=PoolClosed("the policy pool was closed"), timeout=10.0)

    # -- loading ------------------------------------------------------------------------

    async def _policy(self, key: Key) -> _Policy:
        with self._lock:
            if self._closed:
                raise PoolClosed("the policy pool is closed")
            policy = self._policies.get(key)
            if policy is not None:
                self._policies.move_to_end(key)
                return policy
            pending = self._loading.get(key)
            if pending is None:  # the first request for this version loads it; the rest wait
                pending = self._loading[key] = Future()
                pending.set_running_or_notify_cancel()  # a cancelled waiter must not cancel the load
                threading.Thread(
                    target=self._load_into, args=(key, pending), name=f"load-{key[0]}-v{key[1]}", daemon=True
                ).start()
        return await asyncio.wrap_future(pending)

    def _load_into(self, key: Key, pending: Future) -> None:
        try:
            policy = self._load(key)
        except BaseException as exc:
            with self._lock:
                self._loading.pop(key, None)
            pending.set_exception(exc)
            return
        evicted: list[_Policy] = []
        with self._lock:
            self._loading.pop(key, None)
            closed = self._closed
            if not closed:
                self._policies[key] = policy
                while len(self._policies) > self.max_models:
                    evicted.append(self._policies.popitem(last=False)[1])
        if closed:
            policy.close(abort=PoolClosed("the policy pool was closed"))
            pending.set_exception(PoolClosed("the policy pool was closed while loading"))
            return
        pending.set_result(policy)
        for old in evicted:  # answers what it has queued, then lets go of the model
            log.info("unloading %s v%s (least recently used)", *old.key)
            threading.Thread(target=old.close, name=f"unload-{old.key[0]}", daemon=True).start()

    def _load(self, key: Key) -> _Policy:
        from alignflow.models.factory import load_causal_lm

        source = self._local.get(key)
        if isinstance(source, tuple):
            model, tokenizer = source
        else:
            path = source if source is not None else self._download(key)
            model, tokenizer = load_causal_lm(path, merge_lora=True)
        device = self.device or _default_device()
        model.to(device)
        model.eval()
        self._load_counts[key] = self._load_counts.get(key, 0) + 1
        log.info("loaded %s v%s on %s", *key, device)
        if self._generate_fn is None:
            from alignflow.models.prompting import generate

            self._generate_fn = generate
        return _Policy(
            key,
            model,
            tokenizer,
            self._generate_fn,
            self.max_new_tokens,
            self.max_batch,
            self.max_wait_ms / 1000.0,
        )

    def _download(self, key: Key) -> Path:
        """The version's folder in the cache, fetched from the registry the first time."""
        from mlflow.exceptions import MlflowException

        from alignflow.registry.models import download_model_dir

        name, version = key
        if not version.isdigit():
            raise ValueError(f"version must be a registered version number, got {version!r}")
        local = _local_source(self.tracking_uri, name, version)
        if local is not None:  # registered from a folder on this machine (the library launcher)
            return local
        store = hashlib.sha256(self.tracking_uri.encode()).hexdigest()[:12]
        target = self.cache_dir / store / _slug(name) / version
        if (target / "config.json").exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.parent / f".{version}.partial-{uuid.uuid4().hex[:8]}"
        try:
            try:
                fetched = download_model_dir(self.tracking_uri, name, version, partial)
            except MlflowException as exc:
                if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                    raise PolicyNotFound(f"no registered model version {name} v{version}") from exc
                raise
            if fetched is None:
                raise PolicyNotFound(f"no registered model version {name} v{version}")
            try:
                os.replace(partial, target)  # atomic: a folder in the cache is always complete
            except OSError:
                if not (target / "config.json").exists():  # not another process's complete copy
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return target


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
