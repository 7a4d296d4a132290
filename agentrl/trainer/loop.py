"""A persistent asyncio event loop in a background thread, for the synchronous TRL side to call into.

TRL calls `rollout_func` (and our callbacks) synchronously from the training thread, but the runner, the sandbox
pool and the engine are async and must live on ONE loop for the whole job (the pool's sandboxes, the engine's
futures and the scheduler's semaphores are bound to the loop they were created on). `BackgroundLoop.run(coro)`
submits a coroutine to that loop and blocks the calling thread until it finishes; an interrupt of the caller
cancels the coroutine, so every `finally` (sandbox teardown) still runs on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Owns one event loop running in a daemon thread. Use as a context manager or call `close()`."""

    def __init__(self, name: str = "agentrl-train-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and return its result (or raise its exception) in the calling thread."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("BackgroundLoop.run called from its own loop thread (would deadlock); await instead")
        finished = threading.Event()

        async def tracked() -> T:
            try:
                return await coro
            finally:
                finished.set()

        future = asyncio.run_coroutine_threadsafe(tracked(), self.loop)
        try:
            return future.result(timeout)
        except (KeyboardInterrupt, TimeoutError):
            future.cancel()
            finished.wait(30)  # let the coroutine's finally blocks (sandbox teardown) run before we propagate
            raise

    @property
    def closed(self) -> bool:
        return not self._thread.is_alive()

    def close(self) -> None:
        """Cancel what is still pending, stop the loop and join its thread. Idempotent."""
        if self.closed:
            return

        async def _cancel_pending() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(_cancel_pending(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            if not self._thread.is_alive():
                self.loop.close()

    def __enter__(self) -> BackgroundLoop:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
