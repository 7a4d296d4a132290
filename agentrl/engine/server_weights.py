"""What the HTTP engine clients (SGLang, vLLM) share about weight updates and retries.

Owns: the client state both keep (connection flags, the update gate: new generate calls wait while our own weight
update runs; one update at a time), the template of an update (load on every worker, verify the version everywhere,
then tag later turns with it), the retry backoff, and the properties both expose (weight version, context window,
workers). Each client supplies `_load_everywhere(path, version)` and `_verify_version(version)` with its
server's own endpoints, plus `connect()`, `_version`, `stats.weight_updates` and `retry_backoff_s`.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

MAX_BACKOFF_S = 10.0


class ServerWeights:
    """Mixin for the HTTP engine clients; see the module docstring."""

    name: str
    retry_backoff_s: float
    _update_lock: asyncio.Lock | None
    _gate: asyncio.Event | None
    _version: int
    _context_window: int | None
    _workers: list[str]
    stats: Any

    def _init_server_state(self) -> None:
        self._server: dict[str, Any] = {}
        self._connected = False
        self._connect_lock: asyncio.Lock | None = None
        self._update_lock = None
        self._gate = None  # cleared while our own weight update runs

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def context_window(self) -> int:
        if self._context_window is None:
            from agentrl.errors import EngineError

            raise EngineError(f"{self.name} engine: context window unknown; await engine.connect() or set "
                              "engine.context_window")
        return self._context_window

    @property
    def workers(self) -> list[str]:
        """The worker URLs control calls go to (known after `connect()` in router mode)."""
        return list(self._workers)

    async def connect(self) -> None:  # pragma: no cover - provided by the client
        raise NotImplementedError

    async def _load_everywhere(self, path: str, version: int) -> None:  # pragma: no cover - provided by the client
        raise NotImplementedError

    async def _verify_version(self, version: int) -> None:  # pragma: no cover - provided by the client
        raise NotImplementedError

    def _backoff(self, attempt: int) -> float:
        return min(self.retry_backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S) * random.uniform(0.5, 1.0)

    async def _wait_gate(self) -> None:
        if self._gate is not None and not self._gate.is_set():
            await self._gate.wait()

    async def update_weights(self, source: Any, version: int) -> None:
        """Load the checkpoint dir `source` (visible to every worker) on every worker, tagged `version`."""
        if not isinstance(source, (str, os.PathLike)):
            raise self._not_a_checkpoint(source)
        await self.connect()
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            self._gate = self._gate or asyncio.Event()
            self._gate.clear()
            try:
                await self._load_everywhere(os.fspath(source), version)
                await self._verify_version(version)
                self._version = version
                self.stats.weight_updates += 1
            finally:
                self._gate.set()

    def _not_a_checkpoint(self, source: Any) -> Exception:
        from agentrl.errors import ConfigError

        return ConfigError(f"{self.name} engine: update_weights needs a checkpoint directory saved with "
                           f"save_pretrained (got {type(source).__name__}); use weight_sync: disk")
