"""The policy's tools, their state in the sandbox (the env is shared across trajectories; it keeps only each
sandbox's shell pid, see shell.py):

    bash                a persistent bash session per trajectory (shell.py): the working directory, variables,
                        functions and aliases carry over; stdout+stderr go to a file of which the head and tail are
                        shown (the middle cut); the call returns when the command finishes, and anything it left
                        running in the background is killed then; a timeout kills the command (the shell too, with a
                        note, when it cannot be stopped otherwise)
    str_replace_editor  view (numbered lines, ranges; directories list two levels) / create / str_replace
                        (exactly one match, else how many and on which lines) / insert / undo_edit (a per-file stack
                        of at most UNDO_DEPTH copies kept on the sandbox's disk, UNDO_DIR, made and restored by `cp`
                        in the sandbox: no copy passes through the agent or the host; STATE_DIR/undo.json holds
                        only their names)
    submit              ends the episode

Task-level failures (bad arguments, missing files, a path outside the workspace) are ToolResults with `error`.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from agentrl.sandbox.client import Sandbox, SandboxFileError, SandboxPathError
from agentrl.types import ToolCall, ToolResult
from agentrl_repo_fix.config import REPO, STATE_DIR
from agentrl_repo_fix.shell import ShellSessions

UNDO_FILE = f"{STATE_DIR}/undo.json"  # {path: [copy name or None (the file did not exist)]}, oldest first
UNDO_DIR = f"{STATE_DIR}/undo"  # the copies themselves
UNDO_DEPTH = 10
UNDO_NAME = re.compile(r"[0-9a-f]{16}")  # a copy's name as _push_undo makes it (anything else in undo.json: ignored)
VIEW_MAX_LINES = 400
EDIT_MAX_BYTES = 64 * 1024 * 1024  # a file the editor reads (its text is held on the host a few times over)


def cap(text: str, limit: int) -> str:
    """`text` with its middle cut when longer than `limit` (head and tail kept: errors are usually at the end)."""
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def _fail(call: ToolCall, message: str, kind: str = "bad_arguments") -> ToolResult:
    return ToolResult(call_id=call.id, name=call.name, output=message, error=kind)


async def run_bash(sandbox: Sandbox, call: ToolCall, *, sessions: ShellSessions, initial_env: dict[str, str],
                   timeout_s: float, limit: int) -> ToolResult:
    command = call.arguments.get("command")
    if not isinstance(command, str) or not command.strip():
        return _fail(call, "bash needs a non-empty string argument 'command'")
    half = max(limit // 2 - 200, 200)  # the client keeps head + tail of the output; cap() below is a backstop
    started = time.monotonic()
    res = await sessions.run(sandbox, command, env=initial_env, cwd=REPO, timeout_s=timeout_s, half=half)
    out = res.output
    if res.timed_out:
        out += f"\n[the command timed out after {timeout_s:g}s and was killed]"
    elif res.exit_code:
        out += f"\n[exit code {res.exit_code}]"
    if res.note:
        out += "\n" + res.note
    return ToolResult(call_id=call.id, name=call.name, output=cap(out, limit) or "(no output)",
                      exit_code=res.exit_code, duration_s=round(time.monotonic() - started, 6),
                      timed_out=res.timed_out, truncated=res.truncated or len(out) > limit)


def resolve(path: str) -> str:
    return path if path.startswith("/") else f"{REPO}/{path}"


async def run_editor(sandbox: Sandbox, call: ToolCall, *, limit: int) -> ToolResult:
    args = call.arguments
    command, path = args.get("command"), args.get("path")
    if not isinstance(path, str) or not path:
        return _fail(call, "str_replace_editor needs a string argument 'path'")
    handler = _EDITOR.get(command) if isinstance(command, str) else None
    if handler is None:
        return _fail(call, f"unknown command {command!r}: use one of {', '.join(_EDITOR)}")
    path = resolve(path)
    try:
        output = await handler(sandbox, path, args)
    except _EditorError as exc:
        return _fail(call, str(exc), "tool_failed")
    except SandboxPathError:
        return _fail(call, f"{path}: outside the workspace or not accessible", "tool_failed")
    except SandboxFileError as exc:
        return _fail(call, f"{path}: not a regular file or too large ({exc})", "tool_failed")
    except FileNotFoundError:
        return _fail(call, f"{path}: no such file", "tool_failed")
    return ToolResult(call_id=call.id, name=call.name, output=cap(output, limit), truncated=len(output) > limit)


class _EditorError(Exception):
    pass


async def _read(sandbox: Sandbox, path: str) -> str:
    return (await sandbox.read_bytes(path, limit=EDIT_MAX_BYTES)).decode("utf-8", "replace")


async def _is_dir(sandbox: Sandbox, path: str) -> bool:
    res = await sandbox.exec(["test", "-d", path], timeout=10)
    return res.exit_code == 0


def _string(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise _EditorError(f"this command needs a string argument {key!r}")
    return value


async def _view(sandbox: Sandbox, path: str, args: dict[str, Any]) -> str:
    if await _is_dir(sandbox, path):
        res = await sandbox.exec(["find", path, "-maxdepth", "2", "-not", "-path", "*/.*", "-not", "-name",
                                  "__pycache__"], timeout=20)
        return "\n".join(sorted(res.stdout.splitlines()))
    lines = (await _read(sandbox, path)).splitlines()
    start, end = 1, len(lines)
    rng = args.get("view_range")
    if rng is not None:
        if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, int) for x in rng)):
            raise _EditorError("view_range must be [start, end] (1-based, end -1 = to the end of the file)")
        start, end = rng[0], len(lines) if rng[1] == -1 else rng[1]
        if not 1 <= start <= max(len(lines), 1) or end < start:
            raise _EditorError(f"view_range {rng} is outside the file's {len(lines)} lines")
    shown = lines[start - 1:min(end, start - 1 + VIEW_MAX_LINES)]
    out = "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(shown, start))
    if start - 1 + len(shown) < end:
        out += f"\n[... showing {len(shown)} lines; pass view_range to see lines after {start - 1 + len(shown)}]"
    return out


async def _create(sandbox: Sandbox, path: str, args: dict[str, Any]) -> str:
    text = _string(args, "file_text")
    await _push_undo(sandbox, path)
    await sandbox.exec(["mkdir", "-p", path.rsplit("/", 1)[0] or "/"], timeout=10)
    await sandbox.write_file(path, text)
    return f"created {path} ({len(text.splitlines())} lines)"


async def _str_replace(sandbox: Sandbox, path: str, args: dict[str, Any]) -> str:
    old, new = _string(args, "old_str"), args.get("new_str", "")
    if not isinstance(new, str):
        raise _EditorError("new_str must be a string")
    if not old:
        raise _EditorError("old_str must not be empty")
    text = await _read(sandbox, path)
    count = text.count(old)
    if count != 1:
        where = _match_lines(text, old)
        raise _EditorError(f"old_str occurs {count} times in {path}" + (f" (starting on lines {where})" if where
                           else "; check whitespace and indentation, or view the file first")
                           + ("; add surrounding lines to make it unique" if count > 1 else ""))
    await _push_undo(sandbox, path)
    updated = text.replace(old, new, 1)
    await sandbox.write_file(path, updated)
    first = text[:text.index(old)].count("\n") + 1
    return f"edited {path}; lines {first}-{first + new.count(chr(10))} now read:\n" + _snippet(updated, first, new)


def _match_lines(text: str, needle: str) -> str:
    lines: list[str] = []
    pos = text.find(needle)
    while pos != -1 and len(lines) < 20:
        lines.append(str(text[:pos].count("\n") + 1))
        pos = text.find(needle, pos + 1)
    return ", ".join(lines)


def _snippet(text: str, first: int, new: str) -> str:
    lines = text.splitlines()
    lo, hi = max(first - 3, 1), min(first + new.count("\n") + 3, len(lines))
    return "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(lo, hi + 1))


async def _insert(sandbox: Sandbox, path: str, args: dict[str, Any]) -> str:
    new, line = _string(args, "new_str"), args.get("insert_line")
    text = await _read(sandbox, path)
    lines = text.splitlines(keepends=True)
    if not isinstance(line, int) or not 0 <= line <= len(lines):
        raise _EditorError(f"insert_line must be an integer in 0..{len(lines)} (the line to insert after)")
    await _push_undo(sandbox, path)
    block = new if new.endswith("\n") else new + "\n"
    if line and not lines[line - 1].endswith("\n"):
        lines[line - 1] += "\n"
    updated = "".join(lines[:line]) + block + "".join(lines[line:])
    await sandbox.write_file(path, updated)
    return f"inserted {block.count(chr(10))} line(s) after line {line} of {path}:\n" + _snippet(updated, line + 1, new)


async def _undo(sandbox: Sandbox, path: str, args: dict[str, Any]) -> str:
    stacks = await _load_undo(sandbox)
    stack = stacks.get(path) or []
    if not stack:
        raise _EditorError(f"no edit of {path} to undo")
    previous = stack.pop()
    if previous is None:
        await sandbox.exec(["rm", "-f", "--", path], timeout=10)
        message = f"undid the creation of {path} (removed)"
    else:  # in place (cp opens the file with O_TRUNC): its inode, mode and links stay what they are
        res = await sandbox.exec(["cp", "--", f"{UNDO_DIR}/{previous}", path], timeout=UNDO_TIMEOUT_S)
        if res.exit_code != 0:
            raise _EditorError(f"could not restore {path}: {(res.stderr or res.stdout).strip()[-300:]}")
        await sandbox.exec(["rm", "-f", "--", f"{UNDO_DIR}/{previous}"], timeout=10)
        message = f"restored {path} to before its last edit"
    await sandbox.write_file(UNDO_FILE, json.dumps(stacks))
    return message


async def _load_undo(sandbox: Sandbox) -> dict[str, list[str | None]]:
    """The stacks of copy names from UNDO_FILE ({} when missing or unreadable; entries that are not names
    _push_undo makes are dropped: the file is in the workspace, where the policy may write)."""
    try:
        data = json.loads(await sandbox.read_bytes(UNDO_FILE, limit=1 << 20))
    except (FileNotFoundError, ValueError, SandboxFileError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {path: [e for e in stack if e is None or (isinstance(e, str) and UNDO_NAME.fullmatch(e))]
            for path, stack in data.items() if isinstance(path, str) and isinstance(stack, list)}


# Copy $1 (the file before an edit) to $2 in the sandbox; print "absent" when $1 does not exist.
_KEEP = 'mkdir -p -- "$3" && if [ -e "$1" ] || [ -L "$1" ]; then exec cp -- "$1" "$2"; else echo absent; fi'
UNDO_TIMEOUT_S = 120


async def _push_undo(sandbox: Sandbox, path: str) -> None:
    """Remember `path`'s content before an edit: a copy made by `cp` on the sandbox's disk (None on the stack: the
    file did not exist). The oldest copies beyond UNDO_DEPTH are removed."""
    name = secrets.token_hex(8)
    res = await sandbox.exec(["sh", "-c", _KEEP, "sh", path, f"{UNDO_DIR}/{name}", UNDO_DIR],
                             timeout=UNDO_TIMEOUT_S)
    if res.exit_code != 0:
        raise _EditorError(f"could not keep a copy of {path} for undo_edit: "
                           f"{(res.stderr or res.stdout).strip()[-300:]}")
    stacks = await _load_undo(sandbox)
    stack = stacks.setdefault(path, [])
    stack.append(None if res.stdout.strip() == "absent" else name)
    dropped = [e for e in stack[:-UNDO_DEPTH] if e is not None]
    del stack[:-UNDO_DEPTH]
    await sandbox.write_file(UNDO_FILE, json.dumps(stacks))
    if dropped:
        await sandbox.exec(["rm", "-f", "--", *(f"{UNDO_DIR}/{e}" for e in dropped)], timeout=10)


_EDITOR = {"view": _view, "create": _create, "str_replace": _str_replace, "insert": _insert, "undo_edit": _undo}
