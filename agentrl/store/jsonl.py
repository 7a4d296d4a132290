"""Append-only versioned JSONL store of trajectories. Imports only `agentrl.types` and `agentrl.errors`.

Owns: the file format (one `Trajectory` JSON per line), crash safety, resume bookkeeping and tolerant reading.
Does not own: what a trajectory contains (types.py) or how rewards are computed (reward/).

Crash safety: a group (the G samples of one task) is serialised up front and written with a single `write` +
`fsync`, so after `kill -9` at most the last group can be torn. Opening a store for append repairs the tail: it
cuts the file back to the end of the last complete group (every line of a group carries `meta.group_size`). Readers
never stop at a bad line: they report it (`LineError` naming the line) and go on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from agentrl.errors import StoreError
from agentrl.types import SCHEMA_VERSION, Trajectory


@dataclass(frozen=True)
class LineError:
    """A line that could not be read as a trajectory. `line` is 1-based."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _parse_line(path: str, lineno: int, raw: bytes) -> Trajectory | LineError:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return LineError(path, lineno, f"not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc}); corrupt or truncated line")
    if not isinstance(obj, dict):
        return LineError(path, lineno, "expected a JSON object (one trajectory per line)")
    version = obj.get("schema_version")
    if not isinstance(version, int):
        return LineError(path, lineno, "missing integer 'schema_version'")
    if version > SCHEMA_VERSION:
        return LineError(
            path, lineno, f"schema_version {version} is newer than this agentrl reads ({SCHEMA_VERSION}); upgrade agentrl"
        )
    try:
        return Trajectory.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        return LineError(path, lineno, f"invalid trajectory: field '{loc}': {first['msg']}")


def iter_records(path: str | os.PathLike[str]) -> Iterator[Trajectory | LineError]:
    """Yield every trajectory in `path`, and a `LineError` in place of each unreadable line."""
    p = Path(path)
    if not p.exists():
        raise StoreError(f"trajectory file {str(p)!r} does not exist")
    with p.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if raw.strip():
                yield _parse_line(str(p), lineno, raw)


def read_trajectories(path: str | os.PathLike[str], errors: list[LineError] | None = None) -> list[Trajectory]:
    """All readable trajectories of `path`; unreadable lines are appended to `errors` if given."""
    out: list[Trajectory] = []
    for rec in iter_records(path):
        if isinstance(rec, LineError):
            if errors is not None:
                errors.append(rec)
        else:
            out.append(rec)
    return out


def _complete_prefix(data: bytes) -> int:
    """Byte length of the longest prefix of `data` made of complete groups of complete lines."""
    end = data.rfind(b"\n") + 1  # drop a torn last line
    good, pos, counts = 0, 0, {}
    while pos < end:
        nl = data.index(b"\n", pos) + 1
        try:
            obj = json.loads(data[pos:nl])
            gid, size = obj["group_id"], int(obj.get("meta", {}).get("group_size", 1))
        except (ValueError, KeyError, TypeError):
            gid, size = None, 1  # foreign/corrupt line: keep it (readers report it), it closes no group
        if gid is None:
            good = nl if not counts else good
        else:
            counts[gid] = counts.get(gid, 0) + 1
            if counts[gid] >= size:
                del counts[gid]
            if not counts:
                good = nl
        pos = nl
    return good


class TrajectoryStore:
    """Append-only JSONL file of trajectories. Use as a context manager or call `close()`."""

    def __init__(self, path: str | os.PathLike[str], *, resume: bool = False) -> None:
        self.path = Path(path)
        self.repaired_bytes = 0
        if self.path.exists() and self.path.stat().st_size > 0 and not resume:
            raise StoreError(
                f"{str(self.path)!r} already holds trajectories; pass --resume to continue it, or choose another --out"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._repair_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _repair_tail(self) -> None:
        data = self.path.read_bytes()
        keep = _complete_prefix(data)
        if keep < len(data):
            self.repaired_bytes = len(data) - keep
            with self.path.open("r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())

    def append_group(self, trajectories: Iterable[Trajectory]) -> None:
        """Write one group atomically with respect to crashes (one write, then fsync)."""
        trajs = list(trajectories)
        payload = b"".join(t.model_dump_json().encode() + b"\n" for t in trajs)
        view = memoryview(payload)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)

    def completed(self) -> list[Trajectory]:
        return read_trajectories(self.path) if self.path.exists() else []

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
