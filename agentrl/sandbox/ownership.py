"""Who owns a sandbox, and when a sweep may remove it: the rules every backend's sweep applies.

Owns: the owner record a backend writes on each sandbox it creates (host, pid, the pid's start time) and
`owner_gone`, the liveness rule that reads it back. A sweep may remove the sandboxes of an owner that ran on this
host and is gone, or whose pid now names another process (pid reuse: the start time differs). An owner on another
host is never judged here: only the sandbox's TTL removes it, because no pid of another machine means anything
here. Also the rest of the sweep rule: `ttl_passed` (a recorded creation time + TTL, unreadable = no TTL),
`sweep_selects` (every sandbox with `all_runs`, exactly a run's with `run_id`, else the orphans) and
`caller_run_id` (the run id from a caller's labels). Does not own: where the record is kept (docker labels, pod
annotations, the local backend's state file: each backend's wiring), or which sandboxes a sweep looks at and what
else orphans one (a dead pod, a gone owner pod: `kubernetes/pods.py`).

The record is strings, as labels and annotations hold them; the local backend's state file keeps the pid and start
as numbers, which `owner_gone` accepts too.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


def host_id() -> str:
    """This host's name, as owner records carry it."""
    return socket.gethostname()


def process_start(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), which tells a process from a later
    one that reused its pid; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    try:
        return int(text.rpartition(")")[2].split()[19])
    except (IndexError, ValueError):
        return None


def alive(pid: object, start: object) -> bool:
    """`pid` names a running process that started at `start` (clock ticks since boot; a process that reused the pid
    started later). A missing `start` is judged by the pid alone."""
    if not str(pid).isdigit():
        return False
    now = process_start(int(str(pid)))
    if now is None:
        return False
    return start in (None, "") or str(start) == str(now)


def owner_gone(host: object, pid: object, start: object, *, here: str | None = None) -> bool:
    """The owner recorded as (`host`, `pid`, `start`) ran on this host (`here`, default `host_id()`) and is gone, or
    its pid now names another process. False for an owner of another host or a record without a pid: those are
    left to the TTL."""
    if host != (here if here is not None else host_id()) or not str(pid).isdigit():
        return False
    return not alive(pid, start)


def ttl_passed(created_at: object, ttl_s: object, now: float) -> bool:
    """`now` is past `created_at` + `ttl_s` (seconds; numbers or their strings). A record without a readable
    creation time or TTL has none: False, never a crash of the sweep."""
    try:
        return now > float(created_at) + float(ttl_s)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def sweep_selects(*, run: object, run_id: str | None, all_runs: bool, orphaned: Callable[[], bool]) -> bool:
    """Whether a sweep removes one of agentrl's sandboxes (the backend has checked it is ours): with `all_runs`,
    every one; with `run_id`, exactly those whose recorded `run` is that run; with neither, the orphans
    (`orphaned()`, asked only then: a TTL passed, an owner gone, whatever else the backend knows)."""
    if all_runs:
        return True
    if run_id is not None:
        return run == run_id
    return orphaned()


def caller_run_id(labels: Mapping[str, object], keys: Iterable[str]) -> str:
    """The run id a caller's labels carry: the first non-empty of `keys` (the backend's order), else ""."""
    return str(next((labels[k] for k in keys if labels.get(k)), ""))


@dataclass(frozen=True)
class OwnerRecord:
    """This process as the owner of the sandboxes it creates."""

    host: str
    pid: int
    start: str  # "" when /proc does not say (then only the pid is compared)

    @classmethod
    def here(cls, host: str | None = None) -> OwnerRecord:
        pid = os.getpid()
        start = process_start(pid)
        return cls(host=host if host is not None else host_id(), pid=pid, start="" if start is None else str(start))
