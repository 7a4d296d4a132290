"""What the agent reads of /proc: /proc/PID/stat fields, the command user's live processes, the agent's
descendants; and two small descriptor helpers (pidfds, closing a batch)."""

from __future__ import annotations

import os
import time


def stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses): [0] state,
    [1] ppid, [2] pgrp, [3] session, [19] start time in clock ticks since boot; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return None


def stat_int(pid: int | str, index: int) -> int | None:
    """Field `index` of stat_fields as an int; None when the process is gone or the field unreadable."""
    rest = stat_fields(pid)
    try:
        return int(rest[index]) if rest is not None else None
    except (ValueError, IndexError):
        return None


def leader_start(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), if it leads its own session (as every command does)."""
    rest = stat_fields(pid)
    try:
        return int(rest[19]) if rest is not None and int(rest[3]) == pid else None
    except (ValueError, IndexError):
        return None


def boot_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def proc_fields(pid: str) -> tuple[str, int] | None:
    """(state, ppid) of a process from /proc/PID/stat; None when it is gone."""
    rest = stat_fields(pid)
    if rest is None:
        return None
    return rest[0].decode(), int(rest[1])


def command_user_pids(uid: int) -> set[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                text = f.read()
        except OSError:
            continue
        state = text.partition(b"\nState:")[2].split(None, 1)[:1]
        uids = text.partition(b"\nUid:")[2].split(None, 1)[:1]
        if uids and int(uids[0]) == uid and state and state[0] != b"Z":
            out.add(int(name))
    return out


def descendants() -> set[int]:
    """Live (not zombie) descendants of this process (orphans included: the agent is their subreaper)."""
    children: dict[int, list[int]] = {}
    zombies = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = proc_fields(name)
        if fields is None:
            continue
        children.setdefault(fields[1], []).append(int(name))
        if fields[0] == "Z":
            zombies.add(int(name))
    out, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out - zombies


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def close_fds(fds: tuple[int | None, ...]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)
