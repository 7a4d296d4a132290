"""Deferred per-turn drift checks: the answers of `render.DriftCheck`, computed after a trajectory's last turn in a
worker process, so the full-conversation template renders (jinja holds the GIL) never run on the event loop.

Owns: the worker process pool (spawn-safe: each worker builds its own `ChatRenderer` once from the pickled tokenizer
and tool specs; the renderer stays the only owner of templates), its bound on queued work (`max_pending`: a caller
waits for room, so thousands of finishing trajectories cannot pile up unbounded work), and its failure handling: a
worker that crashes or overruns `timeout_s` is killed and replaced, and the caller gets a `DriftCheckError` (the
flags are monitoring only; a failed check never fails a trajectory).

Modes (config `drift_check`): `deferred` (this module), `inline` (DriftCheck on the event loop each turn, the
original behaviour), `off` (no check; the flags stay unset).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from agentrl.tools.render import ChatRenderer, drift_answers, message_dicts
from agentrl.types import Message, ToolSpec

log = logging.getLogger("agentrl.tools.drift")

DriftMode = Literal["deferred", "inline", "off"]
DRIFT_MODES: tuple[str, ...] = ("deferred", "inline", "off")

_renderer: ChatRenderer | None = None  # the worker process's own renderer (set by _init_worker)


class DriftCheckError(RuntimeError):
    """The deferred drift check did not produce answers (worker crashed, timed out, or raised)."""


def _init_worker(tokenizer: Any, tools: list[ToolSpec], fast: bool) -> None:
    global _renderer
    _renderer = ChatRenderer(tokenizer, tools, fast=fast)


def _work(dicts: list[dict[str, Any]], ids: list[int], marks: list[tuple[int, int, int]]) -> list[tuple[bool, bool]]:
    if _renderer is None:
        raise DriftCheckError("drift worker used before its initializer ran")
    return drift_answers(_renderer, dicts, ids, marks)


def _worker_cpu_s() -> float:
    return time.process_time()


class DeferredDrift:
    """A pool of drift-check worker processes for one renderer's tokenizer and tools.

    `answers(messages, ids, marks)` returns the per-turn (prefix_drift, retokenize_mismatch) pairs that a
    `DriftCheck` would have returned at each mark; it awaits without blocking the loop. Close it (or use it as a
    context manager) to stop the workers."""

    def __init__(self, renderer: ChatRenderer, *, workers: int = 1, max_pending: int = 64, timeout_s: float = 120.0,
                 start_method: str = "spawn") -> None:
        if workers < 1 or max_pending < 1 or timeout_s <= 0:
            raise ValueError(f"DeferredDrift: workers ({workers}), max_pending ({max_pending}) and timeout_s "
                             f"({timeout_s}) must be positive")
        self._initargs = (renderer.tok, renderer.tool_specs, renderer.fast)
        self._workers = workers
        self._ctx = multiprocessing.get_context(start_method)
        self._pool: ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()
        self._room = asyncio.Semaphore(max_pending)
        self.timeout_s = timeout_s
        self.stats = {"checked": 0, "errors": 0, "restarts": 0}

    async def _executor(self) -> ProcessPoolExecutor:
        """The running pool; a new one is started in a daemon thread: spawning writes the pickled tokenizer to the
        child synchronously, which must never block the event loop (nor hang it if the child dies first)."""
        async with self._starting:
            if self._pool is None:
                self._pool = await asyncio.wait_for(_in_daemon_thread(self._new_pool), self.timeout_s)
            assert self._pool is not None
            return self._pool

    def _new_pool(self) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(self._workers, mp_context=self._ctx, initializer=_init_worker,
                                   initargs=self._initargs)
        try:
            for fut in [pool.submit(_worker_cpu_s) for _ in range(self._workers)]:  # spawns every worker now
                fut.result()
        except BaseException:
            _kill(pool)
            raise
        return pool

    async def answers(self, messages: list[Message], ids: list[int],
                      marks: list[tuple[int, int, int]]) -> list[tuple[bool, bool]]:
        """Per-mark answers; raises DriftCheckError (never anything else but CancelledError)."""
        if not marks:
            return []
        dicts = message_dicts(messages[: max(m for _, m, _ in marks)])
        ids = ids[: max(n for _, _, n in marks)]
        async with self._room:
            try:
                out = await self._submit(_work, dicts, ids, marks)
            except DriftCheckError:
                self.stats["errors"] += 1
                raise
        self.stats["checked"] += 1
        return list(out)

    async def _submit(self, fn: Any, *args: Any) -> Any:
        for attempt in (0, 1):  # a pool broken by another job's crash or timeout gets one fresh try
            pool = None
            try:
                pool = await self._executor()
                fut = pool.submit(fn, *args)
                return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout_s)
            except BrokenProcessPool as exc:
                self._restart(pool)
                if attempt:
                    raise DriftCheckError(f"the drift worker process died ({exc})") from exc
            except TimeoutError as exc:
                self._restart(pool)
                raise DriftCheckError(f"the drift check took over {self.timeout_s:g}s; its worker was "
                                      "restarted") from exc
            except Exception as exc:  # noqa: BLE001 - a bug or a template error in the worker: monitoring only
                raise DriftCheckError(f"{type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    def _restart(self, pool: ProcessPoolExecutor | None) -> None:
        """Kill `pool`'s workers (a hung render cannot be interrupted otherwise); the next job starts a new pool.
        `pool` None: starting a pool failed (it is already gone)."""
        self.stats["restarts"] += 1
        log.warning("drift check worker crashed, failed to start or timed out; restarting it")
        if pool is None or self._pool is not pool:
            return  # never started, or already replaced by a concurrent caller
        self._pool = None
        _kill(pool)

    async def worker_cpu_s(self) -> float:
        """CPU seconds the (single) worker process has used so far (for benchmarks; starts it if needed)."""
        return float(await self._submit(_worker_cpu_s))

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    async def aclose(self) -> None:
        """`close` without blocking the event loop (it waits for the workers to exit)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> DeferredDrift:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """`fn()` in a daemon thread (one that hangs can neither block the loop nor the interpreter's exit)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not fut.done():
            fut.set_exception(error) if error is not None else fut.set_result(value)

    def run() -> None:
        try:
            value, error = fn(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            if isinstance(value, ProcessPoolExecutor):
                _kill(value)

    threading.Thread(target=run, name="agentrl-drift-start", daemon=True).start()
    return fut


def _kill(pool: ProcessPoolExecutor) -> None:
    processes = dict(getattr(pool, "_processes", None) or {})  # private, but the only handle on a hung worker
    for proc in processes.values():
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    pool.shutdown(wait=False, cancel_futures=True)
