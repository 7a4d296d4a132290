"""Sticky, load-aware choice of a worker per trajectory, for every HTTP engine that talks to its workers directly.

Owns: the in-flight request count per worker, the session -> worker map (LRU, bounded), and short cool-downs for
workers that just failed. Pure bookkeeping on the event loop thread: no I/O, no locks needed.

Policy. A session's first turn goes to the healthy worker with the fewest requests in flight (ties: fewest pinned
sessions, then the order of the URL list), and the session is pinned there, so its later turns find their prefix
in that worker's prefix cache. A pin is dropped when the session ends (`forget`), when it is the least recently
used beyond `max_sessions`, or when its worker fails (the next turn re-picks; its prefix is recomputed once).
A failed worker is avoided for `cooldown_s` unless every worker is cooling down.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from contextlib import contextmanager


class WorkerRouter:
    def __init__(self, urls: list[str], *, max_sessions: int = 100_000, cooldown_s: float = 5.0) -> None:
        if not urls:
            raise ValueError("WorkerRouter needs at least one worker URL")
        self.urls = list(urls)
        self.max_sessions = max_sessions
        self.cooldown_s = cooldown_s
        self.in_flight: dict[str, int] = {u: 0 for u in self.urls}
        self._pinned: dict[str, int] = {u: 0 for u in self.urls}
        self._sessions: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._down_until: dict[str, float] = {}

    def pick(self, session_id: str) -> str:
        """The worker for this session's next request (pins the session on first use)."""
        url = self._sessions.get(session_id)
        if url is not None and not self._cooling(url):
            self._sessions.move_to_end(session_id)
            return url
        if url is not None:
            self._unpin(session_id)
        url = self._least_loaded()
        self._sessions[session_id] = url
        self._pinned[url] += 1
        while len(self._sessions) > self.max_sessions:
            self._unpin(next(iter(self._sessions)))
        return url

    @contextmanager
    def track(self, url: str) -> Iterator[None]:
        """Count one request in flight on `url` for the duration of the block."""
        self.in_flight[url] += 1
        try:
            yield
        finally:
            self.in_flight[url] -= 1

    def failed(self, url: str, session_id: str | None = None) -> None:
        """`url` did not answer: cool it down and unpin `session_id` so its retry may go elsewhere."""
        self._down_until[url] = time.monotonic() + self.cooldown_s
        if session_id is not None and self._sessions.get(session_id) == url:
            self._unpin(session_id)

    def forget(self, session_id: str) -> None:
        """The trajectory ended: drop its pin."""
        if session_id in self._sessions:
            self._unpin(session_id)

    def worker_of(self, session_id: str) -> str | None:
        return self._sessions.get(session_id)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def _least_loaded(self) -> str:
        healthy = [u for u in self.urls if not self._cooling(u)] or self.urls
        return min(healthy, key=lambda u: (self.in_flight[u], self._pinned[u]))

    def _cooling(self, url: str) -> bool:
        until = self._down_until.get(url)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._down_until[url]
            return False
        return True

    def _unpin(self, session_id: str) -> None:
        url = self._sessions.pop(session_id)
        self._pinned[url] -= 1
