"""Append-only versioned JSONL store of trajectories. Imports only `agentrl.types` and `agentrl.errors`.

Owns: the file format (one `Trajectory` JSON per line), crash safety, resume bookkeeping and tolerant reading.
Does not own: what a trajectory contains (types.py) or how rewards are computed (reward/).

Crash safety: a group (the G samples of one task) is serialised up front and written with a single `write` +
`fsync`, so after `kill -9` at most the last group can be torn. Opening a store for append repairs the tail: it
cuts the file back to the end of the last complete group (every line of a group carries `meta.group_size`). Readers
never stop at a bad line: they report it (`LineError` naming the line) and go on.

Totality: whatever the policy put in a trajectory is stored and read back, and storing never raises for its content.
A record pydantic's JSON writer refuses (a lone surrogate such as "\\ud800" in a tool output or test message, data
nested deeper than its 255-level limit) or would alter (it writes a surrogate in a dict key as U+FFFD, so any line
holding U+FFFD is suspect) is written by `json` instead, from the same field values: ASCII output with
every such code point escaped (`\\ud800`, `\\u0000`), which `json.loads` reads back to the same string. Token ids and
logprobs are copied unchanged. The only values not stored as they are cannot be read back by any JSON reader here
and never come out of the parsers: nesting deeper than `MAX_DATA_DEPTH` below the record, integers with more than
4300 digits, and objects that are not JSON data; each is written (or read back) as a string saying what was there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_json

from agentrl.errors import StoreError
from agentrl.types import MAX_DATA_DEPTH, SCHEMA_VERSION, Trajectory

RECORD_LEVELS = 16  # the record's own nesting above policy data (trajectory > turns > turn > tool_calls > call > ...)
MAX_LINE_DEPTH = MAX_DATA_DEPTH + RECORD_LEVELS
_REPLACEMENT = "\ufffd".encode()
_FLAT = ("prompt_ids", "completion_ids", "logprobs", "env_mask")  # lists of numbers: pydantic writes them exactly
_INT_BITS = 2_000  # ints below this many bits have at most 603 decimal digits: under any int<->str limit


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
        obj = _loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting past the stack
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)[:200] or type(exc).__name__
        return LineError(path, lineno, f"not valid JSON ({why}); corrupt or truncated line")
    if not isinstance(obj, dict):
        return LineError(path, lineno, "expected a JSON object (one trajectory per line)")
    version = obj.get("schema_version")
    if not isinstance(version, int):
        return LineError(path, lineno, "missing integer 'schema_version'")
    if version > SCHEMA_VERSION:
        return LineError(
            path, lineno,
            f"schema_version {version} is newer than this agentrl reads ({SCHEMA_VERSION}); upgrade agentrl"
        )
    try:
        return Trajectory.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        return LineError(path, lineno, f"invalid trajectory: field '{loc}': {first['msg']}")
    except RecursionError:
        return LineError(path, lineno, "invalid trajectory: nested too deeply to read")


def encode_trajectory(traj: Trajectory) -> bytes:
    """`traj` as one JSON line (no newline), for any content (see the module docstring); never raises for it."""
    try:
        line = traj.model_dump_json().encode()
    except (ValueError, RecursionError):  # PydanticSerializationError is a ValueError: surrogates, depth > 255
        line = _REPLACEMENT
    if _REPLACEMENT not in line:
        return line
    # pydantic writes a surrogate in a dict key as U+FFFD instead of refusing it: the json path keeps it (and
    # writes a real U+FFFD as the escape \ufffd, read back the same)
    return _json_line(traj)


def _json_line(traj: Trajectory) -> bytes:
    """The record written by `json` (ASCII, every code point kept); the flat token/logprob arrays, which hold no
    text, are still written by pydantic (the bulk of a record, and json's float formatting is 10x slower)."""
    data = traj.model_dump(mode="python", exclude=set(_FLAT))
    parts = [b'"%s":%s' % (name.encode(), to_json(getattr(traj, name)) if name in _FLAT else _dumps(data[name]))
             for name in type(traj).model_fields]
    return b"{" + b",".join(parts) + b"}"


def _dumps(value: Any) -> bytes:
    return json.dumps(_jsonable(value, 1), ensure_ascii=True, allow_nan=True, separators=(",", ":")).encode()


def _jsonable(root: Any, depth: int) -> Any:
    """A copy of `root` (at `depth` below the record) that `json.dumps` writes without error: built iteratively (no
    recursion on policy data)."""
    out: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(root, out, 0, depth)]
    while stack:
        value, parent, key, depth = stack.pop()
        if isinstance(value, Enum):
            value = value.value
        if isinstance(value, (dict, list, tuple, set, frozenset)) and depth >= MAX_LINE_DEPTH:
            parent[key] = f"<{type(value).__name__} nested deeper than {MAX_LINE_DEPTH} levels: not stored>"
        elif isinstance(value, dict):
            parent[key] = copy = {}
            for k, v in value.items():
                k = k if k is None or _plain(k) is k else str(_scalar(k))
                copy[k] = None  # keeps the key order (children are filled in from the stack's top)
                stack.append((v, copy, k, depth + 1))
        elif isinstance(value, (list, tuple, set, frozenset)):
            parent[key] = _plain_list(value) or _list_into(list(value), stack, depth)
        else:
            parent[key] = _scalar(value)
    return out[0]


def _plain_list(value: Any) -> list[Any] | None:
    """A C-speed copy of a flat list of printable ints / floats / strings, else None."""
    if type(value) is not list or not value:
        return None
    kinds = set(map(type, value))
    if kinds == {int} and _prints(max(value)) and _prints(min(value)):
        return list(value)
    return list(value) if kinds in ({float}, {str}) else None


def _list_into(items: list[Any], stack: list[tuple[Any, Any, Any, int]], depth: int) -> list[Any]:
    copy: list[Any] = [None] * len(items)
    stack.extend((v, copy, i, depth + 1) for i, v in enumerate(items))
    return copy


def _plain(value: Any) -> Any:
    """`value` when `json.dumps` writes it as it is (a str, float, bool, or an int Python prints), else None."""
    return value if type(value) in (str, float, bool) or (type(value) is int and _prints(value)) else None


def _prints(value: int) -> bool:
    if value.bit_length() < _INT_BITS:
        return True
    try:
        int.__repr__(value)  # what json.dumps calls: refused past sys.get_int_max_str_digits()
    except ValueError:
        return False
    return True


def _scalar(value: Any) -> Any:
    """A JSON scalar for a leaf: itself when JSON can write it, else a string naming what it was."""
    if value is None or _plain(value) is value:
        return value
    if isinstance(value, int):  # an int subclass, or more digits than Python converts to text
        return int(value) if _prints(int(value)) else f"<int of {value.bit_length()} bits: not stored>"
    if isinstance(value, (str, float)):
        return (str if isinstance(value, str) else float)(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    try:
        return f"<{type(value).__name__}: {str(value)[:200]}>"
    except Exception:  # noqa: BLE001 - its __str__ is broken: the type name is all there is
        return f"<{type(value).__name__}>"


def _loads(raw: bytes) -> Any:
    """`json.loads`; an integer with more digits than Python converts (only pydantic writes those) is read as the
    marker string the fallback writer uses, instead of losing the line."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise
    except ValueError:
        return json.loads(raw, parse_int=_read_int)


def _read_int(literal: str) -> int | str:
    try:
        return int(literal)
    except ValueError:
        return f"<int of {len(literal) - literal.startswith('-')} digits: not stored>"


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
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
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
        payload = b"".join(encode_trajectory(t) + b"\n" for t in trajs)
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

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
