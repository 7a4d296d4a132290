"""Tool-call parsing: model text -> `ToolCall`s plus error strings. Imports only types.

Owns the two action formats an env can choose (`Env.action_format`), the instructions that teach them to the model,
and a small JSON-schema argument validator. It does not execute anything and never raises on model text: every
problem becomes an error string written to be shown back to the model as an observation.

Model text is hostile, so both parsers are total and linear: every scan moves forward over the text (one pass to
find the tags, one `find` per fence), no regular expression here can backtrack (the only ones left match literal
alternatives), and JSON is read by the C decoder with limits a stored record can hold: at most `MAX_DATA_DEPTH`
levels of nesting, integer literals of at most `MAX_INT_DIGITS` digits, finite numbers only (no NaN/Infinity, no
float that overflows). A call over a limit is a format error shown to the model, like any other malformed call.

Formats
-------
"hermes"     `<tool_call>{"name": "...", "arguments": {...}}</tool_call>`, any number per reply. `arguments` may also
             be a JSON string holding the object (some models emit that); `parameters` is accepted as an alias.
             A body wrapped in a ```json fence inside the tags is unwrapped. Problems reported: unclosed tag, stray
             `</tool_call>`, invalid JSON, JSON over the limits above, missing name, unknown tool, arguments that do
             not match the ToolSpec.
"codeblock"  every fenced block whose info string is `python`, `py` or `python3` becomes
             `ToolCall(name="run_python", arguments={"code": ...})`. A bare ``` block (no info string) is taken only
             if its content parses as Python (`ast.parse`), so pasted output or prose in a bare fence is ignored.
             Blocks in other languages (```bash, ```json, ...) are ignored. A fence is a line starting (after
             optional indentation) with 3+ backticks; it closes at the first later run of at least as many
             backticks: normally a line of only backticks, but also an inline run (small models write
             `return x```) or the next opening fence (a forgotten close). No close at all -> an "unclosed" error
             (for Python blocks). An empty Python block -> an error. Indented fences are dedented.

Call ids are deterministic: `call_{turn}_{i}` where i counts the attempted calls of the reply from 0 (a malformed
attempt still uses up its index, so ids line up with the "tool call N" numbers, which count from 1).
"""

from __future__ import annotations

import ast
import bisect
import json
import math
import re
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.types import MAX_DATA_DEPTH, ToolCall, ToolSpec

Format = Literal["hermes", "codeblock"]
FORMATS: tuple[str, ...] = ("hermes", "codeblock")

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
HERMES_SHAPE = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
CODE_TOOL = "run_python"
PYTHON_INFO = frozenset({"python", "py", "python3"})
_MAX_SNIPPET = 80
MAX_INT_DIGITS = 4300  # Python's own default limit for int <-> str (sys.get_int_max_str_digits)


@dataclass(frozen=True)
class ParseOutcome:
    """The calls parsed from one reply, in order, and one error string per malformed attempt."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_tool_calls(text: str, fmt: str, tools: list[ToolSpec], *, turn: int = 0) -> ParseOutcome:
    """Parse every tool call in `text`. Never raises for any `text`; an unknown `fmt` is a programming error."""
    if fmt == "hermes":
        return _parse_hermes(text, tools, turn)
    if fmt == "codeblock":
        return _parse_codeblocks(text, tools, turn)
    raise ValueError(f"unknown tool-call format {fmt!r}: use one of {', '.join(FORMATS)}")


# -- hermes ----------------------------------------------------------------------------------------------------


_STRAY = -2  # span marker: a </tool_call> with no opener
_UNCLOSED = -1  # span marker: a <tool_call> with no closer


_TAG = re.compile(re.escape(OPEN_TAG) + "|" + re.escape(CLOSE_TAG))  # two literals: one linear pass


def _hermes_spans(text: str) -> list[tuple[int, int, int]]:
    """Tags in text order: (tag_start, body_start, body_end), body_end = _UNCLOSED / _STRAY for broken ones.

    One pass over the tags: a closer with no open tag is stray; an opener followed by another opener is unclosed
    (the second one starts a new call); an opener with nothing after it is unclosed."""
    spans: list[tuple[int, int, int]] = []
    open_at = -1  # the open tag waiting for its closer
    for m in _TAG.finditer(text):
        if m.group() == CLOSE_TAG:
            if open_at < 0:
                spans.append((m.start(), m.start(), _STRAY))
            else:
                spans.append((open_at, open_at + len(OPEN_TAG), m.start()))
                open_at = -1
            continue
        if open_at >= 0:
            spans.append((open_at, open_at + len(OPEN_TAG), _UNCLOSED))
        open_at = m.start()
    if open_at >= 0:
        spans.append((open_at, open_at + len(OPEN_TAG), _UNCLOSED))
    return spans


def _parse_hermes(text: str, tools: list[ToolSpec], turn: int) -> ParseOutcome:
    by_name = {t.name: t for t in tools}
    calls: list[ToolCall] = []
    errors: list[str] = []
    i = 0  # index of the attempted call (stray closers are not attempts)
    for start, body, end in _hermes_spans(text):
        if end == _STRAY:
            errors.append(f"stray {CLOSE_TAG} at char {start} without an opening {OPEN_TAG}; expected {HERMES_SHAPE}")
            continue
        label, call_id, i = f"tool call {i + 1}", f"call_{turn}_{i}", i + 1
        if end == _UNCLOSED:
            errors.append(f"{label}: unclosed {OPEN_TAG} tag (no {CLOSE_TAG} follows it); expected {HERMES_SHAPE}")
            continue
        raw = text[start : end + len(CLOSE_TAG)]
        call, err = _hermes_call(text[body:end], by_name, call_id=call_id, raw=raw)
        if err is not None:
            errors.append(f"{label}: {err}")
        elif call is not None:
            calls.append(call)
    return ParseOutcome(calls=calls, errors=errors)


def _unfence_json(body: str) -> str:
    """The body without a ```json fence around it (plain string slicing: linear in the body)."""
    s = body.strip()
    if len(s) < 6 or not (s.startswith("```") and s.endswith("```")):
        return s
    inner = s[3:-3]
    return (inner[4:] if inner.startswith("json") else inner).strip()


class _Refused(ValueError):
    """JSON that is well-formed but over the limits of a stored tool call (see the module docstring)."""


def _int_literal(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"an integer literal has {digits} digits; at most {MAX_INT_DIGITS} are allowed")
    return int(literal)


def _float_literal(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:_MAX_SNIPPET]!r} is too large for a float")
    return value


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON; write a finite number or null")


def _too_deep(value: Any, limit: int = MAX_DATA_DEPTH) -> bool:
    """Whether `value` nests more than `limit` arrays/objects (iterative: no recursion on policy data)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _loads(src: str) -> tuple[Any, str | None]:
    """`json.loads` for model text: (value, None) or (None, why), never an exception."""
    try:
        value = json.loads(src, parse_int=_int_literal, parse_float=_float_literal, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON at char {exc.pos}: {exc.msg} (near {_snippet(src, exc.pos)!r})"
    except _Refused as exc:
        return None, f"invalid JSON: {exc}"
    except RecursionError:
        return None, f"invalid JSON: nested too deeply (at most {MAX_DATA_DEPTH} levels)"
    except ValueError as exc:  # any other number the decoder cannot convert
        return None, f"invalid JSON: {str(exc)[:_MAX_SNIPPET]}"
    if _too_deep(value):
        return None, f"invalid JSON: nested too deeply (at most {MAX_DATA_DEPTH} levels)"
    return value, None


def _hermes_call(
    body: str, by_name: dict[str, ToolSpec], *, call_id: str, raw: str
) -> tuple[ToolCall | None, str | None]:
    obj, err = _loads(_unfence_json(body))
    if err is not None:
        return None, f"{err}; expected {HERMES_SHAPE}"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {_json_type(obj)}; expected {HERMES_SHAPE}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, f'missing "name" (a non-empty string); expected {HERMES_SHAPE}'
    spec = by_name.get(name)
    if spec is None:
        known = ", ".join(sorted(by_name)) or "none"
        return None, f"unknown tool {name!r}; available tools: {known}"
    args, err = _arguments(obj)
    if err is not None:
        return None, f"{name}: {err}"
    problems = validate_arguments(args, spec.parameters)
    if problems:
        return None, f"{name}: bad arguments: " + "; ".join(problems)
    return ToolCall(id=call_id, name=name, arguments=args, raw=raw), None


def _arguments(obj: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    args = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        return {}, None
    if isinstance(args, str):
        args, err = _loads(args) if args.strip() else ({}, None)
        if err is not None:
            return {}, f'"arguments" is a string but not valid JSON ({err}); pass a JSON object'
    if not isinstance(args, dict):
        return {}, f'"arguments" must be a JSON object, got {_json_type(args)}'
    return args, None


def _snippet(src: str, pos: int) -> str:
    lo = max(0, pos - _MAX_SNIPPET // 2)
    return src[lo : lo + _MAX_SNIPPET]


# -- argument validation (a JSON-schema subset) ------------------------------------------------------------------

_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPE_CHECKS[name](value):
            return name
    return type(value).__name__


def validate_arguments(value: Any, schema: dict[str, Any], path: str = "arguments") -> list[str]:
    """Check `value` against a JSON-schema subset: type (one or a list), properties, required,
    additionalProperties=false, items, enum. Returns one message per problem (empty = valid)."""
    problems: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        known = [n for n in names if n in _TYPE_CHECKS]
        if known and not any(_TYPE_CHECKS[n](value) for n in known):
            return [f"{path} must be {' or '.join(known)}, got {_json_type(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path} must be one of {schema['enum']!r}")
    if isinstance(value, dict):
        problems += _validate_object(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems += validate_arguments(item, schema["items"], f"{path}[{i}]")
    return problems


def _validate_object(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    props: dict[str, Any] = schema.get("properties") or {}
    problems = [f"{path}: missing required field {key!r}" for key in schema.get("required", []) if key not in value]
    for key, item in value.items():
        if key in props and isinstance(props[key], dict):
            problems += validate_arguments(item, props[key], f"{path}.{key}")
        elif key not in props and schema.get("additionalProperties") is False:
            allowed = ", ".join(sorted(props)) or "none"
            problems.append(f"{path}: unexpected field {key!r} (allowed: {allowed})")
    return problems


# -- codeblock -------------------------------------------------------------------------------------------------

def _fence_open(line: str) -> tuple[str, str] | None:
    """(backticks, info string) when `line` opens a fence: optional spaces/tabs, 3+ backticks, then no backtick in
    the rest of the line; the info string is the first word after the run (empty when whitespace other than spaces
    and tabs comes first). String methods only: linear in the line."""
    s = line.lstrip(" \t")
    rest = s.lstrip("`")
    n = len(s) - len(rest)
    if n < 3 or "`" in rest:
        return None
    word = rest.lstrip(" \t")
    info = "" if not word or word[0].isspace() else word.split(None, 1)[0]
    return s[:n], info


def _parse_codeblocks(text: str, tools: list[ToolSpec], turn: int) -> ParseOutcome:
    blocks, unclosed = _fenced_blocks(text)
    if blocks and tools and all(t.name != CODE_TOOL for t in tools):
        return ParseOutcome(errors=[f"code blocks are run with the {CODE_TOOL} tool, which this env does not offer"])
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, (code, raw) in enumerate(blocks):
        if not code.strip():
            errors.append(f"code block {i + 1} is empty; put Python code between ```python and ```")
            continue
        calls.append(ToolCall(id=f"call_{turn}_{i}", name=CODE_TOOL, arguments={"code": code}, raw=raw))
    return ParseOutcome(calls=calls, errors=errors + ([unclosed] if unclosed else []))


def _fenced_blocks(text: str) -> tuple[list[tuple[str, str]], str | None]:
    """[(code, raw_span)] of the Python blocks in `text`, and the error for an unclosed Python fence (which
    swallows the rest of the text, so it is always last)."""
    lines = [line + "\n" for line in text.split("\n")]  # only \n ends a line (not \x85, \u2028...)
    lines[-1] = lines[-1][:-1]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    blocks: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        fence = _fence_open(lines[i].rstrip("\r\n"))
        if fence is None:
            i += 1
            continue
        ticks, info = fence[0], fence[1].lower()
        span = _block_end(text, lines, offsets, i, ticks)
        if span is None:  # unclosed: the rest of the text is inside the fence
            if _wants(info, _dedent(text[offsets[i + 1] :], lines[i])):
                return blocks, f"unclosed code fence {ticks}{info} at line {i + 1}; close the block with {ticks}"
            break
        code_end, end, i_next = span
        code = _dedent(text[offsets[i + 1] : code_end], lines[i])
        if _wants(info, code):
            blocks.append((code, text[offsets[i] : end]))
        i = i_next
    return blocks, None


def _block_end(text: str, lines: list[str], offsets: list[int], i: int, ticks: str) -> tuple[int, int, int] | None:
    """(code_end, span_end, next_line) of the block opened at line i, or None when it never closes.

    The block ends at the first later run of >= len(ticks) backticks: a line of only backticks (the normal close),
    a run inside a line (inline close, `return x```), or the start of a new fence line (a forgotten close; that
    line is then read again as an opening fence)."""
    k = text.find(ticks, offsets[i + 1])
    if k == -1:
        return None
    j = bisect.bisect_right(offsets, k) - 1  # the line holding position k
    if text[offsets[j] : k].strip():
        return k, k + len(ticks), j + 1
    if set(lines[j].strip()) == {"`"}:
        return offsets[j], offsets[j + 1], j + 1
    return offsets[j], offsets[j], j


def _wants(info: str, code: str) -> bool:
    return info in PYTHON_INFO or (info == "" and _is_python(code))


def _dedent(code: str, fence_line: str) -> str:
    return textwrap.dedent(code) if fence_line[:1] in (" ", "\t") else code


def _is_python(code: str) -> bool:
    if not code.strip():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for invalid escapes in pasted text
            ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


# -- rendering ---------------------------------------------------------------------------------------------------


def format_tool_call(call: ToolCall, fmt: str) -> str:
    """The text a model would write for `call` in `fmt` (for prompts, few-shot examples and scripted engines)."""
    if fmt == "hermes":
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{OPEN_TAG}\n{body}\n{CLOSE_TAG}"
    if fmt == "codeblock":
        code = str(call.arguments.get("code", ""))
        return f"```python\n{code}{'' if code.endswith(chr(10)) else chr(10)}```"
    raise ValueError(f"unknown tool-call format {fmt!r}: use one of {', '.join(FORMATS)}")


def format_tool_instructions(fmt: str, tools: list[ToolSpec]) -> str:
    """System-prompt text that teaches `fmt` and lists `tools`."""
    if fmt == "hermes":
        listing = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
        return (
            "You may call one or more functions to help with the task. The functions are listed inside <tools>:\n"
            f"<tools>\n{listing}\n</tools>\n"
            "To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> "
            'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
            "You will see each function's result. When you are finished, reply without a tool call."
        )
    if fmt == "codeblock":
        desc = next((t.description for t in tools if t.name == CODE_TOOL), "Runs Python code.")
        return (
            "Write Python code inside a fenced block:\n```python\n# your code\n```\n"
            f"Every ```python block in your reply is run with {CODE_TOOL}: {desc}\n"
            "When you are finished, reply without a code block."
        )
    raise ValueError(f"unknown tool-call format {fmt!r}: use one of {', '.join(FORMATS)}")
