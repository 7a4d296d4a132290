"""The weight-update gate of an HTTP engine client: new generate calls wait while our own weight update runs.

Owns: one update at a time (a lock), and the gate itself (an event cleared for the duration of an update, so a
generate call that starts meanwhile waits locally instead of racing the swap on the server). Both are created
lazily on the caller's event loop. Does not own what an update does (the engine's `_load_everywhere`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class WeightGate:
    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None
        self._open: asyncio.Event | None = None

    async def wait(self) -> None:
        """Return at once unless an update runs; then when it is over (failed or not)."""
        if self._open is not None and not self._open.is_set():
            await self._open.wait()

    @asynccontextmanager
    async def closed(self) -> AsyncIterator[None]:
        """Run one update: after any update already running, with the gate closed until the block exits."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self._open = self._open or asyncio.Event()
            self._open.clear()
            try:
                yield
            finally:
                self._open.set()
