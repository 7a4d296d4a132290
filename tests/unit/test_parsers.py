"""Tool-call parsers: hermes <tool_call> JSON and fenced python code blocks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.tools import (
    ParseOutcome,
    format_tool_call,
    format_tool_instructions,
    parse_tool_calls,
    validate_arguments,
)
from agentrl.types import ToolCall, ToolSpec

RUN_PYTHON = ToolSpec(
    name="run_python",
    description="Run Python code in the sandbox.",
    parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
)
RUN_TESTS = ToolSpec(name="run_tests", description="Run the visible tests.")
SEARCH = ToolSpec(
    name="search",
    description="Search.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "k": {"type": "integer"},
            "score": {"type": "number"},
            "exact": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "opts": {"type": "object", "properties": {"mode": {"type": "string", "enum": ["a", "b"]}}},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
)
TOOLS = [RUN_PYTHON, RUN_TESTS, SEARCH]


def hermes(obj: object) -> str:
    return f"<tool_call>{json.dumps(obj)}</tool_call>"


# -- hermes: valid calls ----------------------------------------------------------------------------------------


def test_hermes_parses_several_calls_with_deterministic_ids() -> None:
    text = (
        "Let me run it.\n"
        + hermes({"name": "run_python", "arguments": {"code": "print(1)"}})
        + "\nthen\n"
        + hermes({"name": "run_tests", "arguments": {}})
    )
    out = parse_tool_calls(text, "hermes", TOOLS, turn=3)
    assert out.errors == []
    assert [(c.id, c.name, c.arguments) for c in out.calls] == [
        ("call_3_0", "run_python", {"code": "print(1)"}),
        ("call_3_1", "run_tests", {}),
    ]
    assert out.calls[0].raw == hermes({"name": "run_python", "arguments": {"code": "print(1)"}})
    assert parse_tool_calls(text, "hermes", TOOLS, turn=3) == out


def test_hermes_accepts_arguments_as_json_string_and_parameters_alias_and_missing_arguments() -> None:
    text = (
        hermes({"name": "run_python", "arguments": json.dumps({"code": "x = 1"})})
        + hermes({"name": "search", "parameters": {"query": "q"}})
        + hermes({"name": "run_tests"})
    )
    out = parse_tool_calls(text, "hermes", TOOLS)
    assert out.errors == []
    assert [c.arguments for c in out.calls] == [{"code": "x = 1"}, {"query": "q"}, {}]


def test_hermes_unwraps_a_json_fence_inside_the_tags() -> None:
    text = '<tool_call>\n```json\n{"name": "run_tests", "arguments": {}}\n```\n</tool_call>'
    out = parse_tool_calls(text, "hermes", TOOLS)
    assert out.errors == [] and [c.name for c in out.calls] == ["run_tests"]


def test_text_without_calls_gives_nothing() -> None:
    for fmt in ("hermes", "codeblock"):
        assert parse_tool_calls("I am done. The answer is 42.", fmt, TOOLS) == ParseOutcome([], [])


# -- hermes: malformed calls --------------------------------------------------------------------------------------


def test_invalid_json_error_names_position_and_expected_shape() -> None:
    out = parse_tool_calls('<tool_call>{"name": run_python}</tool_call>', "hermes", TOOLS)
    assert out.calls == []
    assert len(out.errors) == 1
    err = out.errors[0]
    assert err.startswith("tool call 1: invalid JSON at char 9:")
    assert '<tool_call>{"name": ..., "arguments": {...}}</tool_call>' in err


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"arguments": {}}, 'missing "name"'),
        ({"name": "", "arguments": {}}, 'missing "name"'),
        ([1, 2], "expected a JSON object, got array"),
        ({"name": "rm"}, "unknown tool 'rm'; available tools: run_python, run_tests, search"),
        ({"name": "run_python", "arguments": {}}, "missing required field 'code'"),
        ({"name": "run_python", "arguments": {"code": 5}}, "arguments.code must be string, got integer"),
        ({"name": "run_python", "arguments": "not json"}, '"arguments" is a string but not valid JSON'),
        ({"name": "run_python", "arguments": [1]}, '"arguments" must be a JSON object, got array'),
        ({"name": "search", "arguments": {"query": "q", "k": True}}, "arguments.k must be integer, got boolean"),
        ({"name": "search", "arguments": {"query": "q", "k": 1.5}}, "arguments.k must be integer, got number"),
        ({"name": "search", "arguments": {"query": "q", "x": 1}}, "unexpected field 'x'"),
        ({"name": "search", "arguments": {"query": "q", "tags": ["a", 3]}}, "arguments.tags[1] must be string"),
        ({"name": "search", "arguments": {"query": "q", "opts": {"mode": "c"}}}, "arguments.opts.mode must be one of"),
    ],
)
def test_malformed_hermes_calls_give_one_clear_error_each(body: object, fragment: str) -> None:
    out = parse_tool_calls(hermes(body), "hermes", TOOLS)
    assert out.calls == []
    assert len(out.errors) == 1
    assert out.errors[0].startswith("tool call 1: ")
    assert fragment in out.errors[0]


def test_unclosed_and_stray_tags_are_errors_and_valid_calls_still_parse() -> None:
    good = hermes({"name": "run_tests"})
    text = 'oops </tool_call> then <tool_call>{"name": "run_tests"} ' + good + ' and <tool_call>{"name": "run_te'
    out = parse_tool_calls(text, "hermes", TOOLS, turn=1)
    assert [c.id for c in out.calls] == ["call_1_1"]  # the unclosed first attempt used index 0
    assert len(out.errors) == 3
    assert "stray </tool_call>" in out.errors[0]
    assert out.errors[1].startswith("tool call 1: unclosed <tool_call>")
    assert out.errors[2].startswith("tool call 3: unclosed <tool_call>")


def test_number_accepts_int_and_float_but_not_bool() -> None:
    schema = SEARCH.parameters
    assert validate_arguments({"query": "q", "score": 1}, schema) == []
    assert validate_arguments({"query": "q", "score": 0.5}, schema) == []
    assert validate_arguments({"query": "q", "score": False}, schema) == ["arguments.score must be number, got boolean"]
    assert validate_arguments(None, {"type": ["string", "null"]}) == []
    assert validate_arguments(3, {"type": ["string", "null"]}) == ["arguments must be string or null, got integer"]


# -- codeblock ------------------------------------------------------------------------------------------------


def test_codeblock_takes_python_fences_and_python_bare_fences_only() -> None:
    text = (
        "Here:\n```python\ndef f():\n    return 1\n```\n"
        "```py\nprint(2)\n```\n"
        "```python3\nprint(3)\n```\n"
        "```\nprint(4)\n```\n"
        "```\nTraceback: this is not python (\n```\n"
        "```bash\nls -la\n```\n"
        "```json\n{\"a\": 1}\n```\n"
    )
    out = parse_tool_calls(text, "codeblock", TOOLS, turn=2)
    assert out.errors == []
    codes = [c.arguments["code"] for c in out.calls]
    assert codes == ["def f():\n    return 1\n", "print(2)\n", "print(3)\n", "print(4)\n"]
    assert [c.id for c in out.calls] == ["call_2_0", "call_2_1", "call_2_2", "call_2_3"]
    assert all(c.name == "run_python" for c in out.calls)
    assert out.calls[0].raw == "```python\ndef f():\n    return 1\n```\n"


def test_codeblock_inline_close_forgotten_close_and_indented_fence() -> None:
    inline = parse_tool_calls("```python\ndef f(): return 1```\nthen\n```python\nx = 2\n```", "codeblock", TOOLS)
    assert [c.arguments["code"] for c in inline.calls] == ["def f(): return 1", "x = 2\n"]
    forgot = parse_tool_calls("```python\nx = 1\n```python\ny = 2\n```", "codeblock", TOOLS)
    assert [c.arguments["code"] for c in forgot.calls] == ["x = 1\n", "y = 2\n"]
    indented = parse_tool_calls("1. do this:\n   ```python\n   if True:\n       x = 1\n   ```\n", "codeblock", TOOLS)
    assert [c.arguments["code"] for c in indented.calls] == ["if True:\n    x = 1\n"]
    four = parse_tool_calls("````python\ns = '```'\n````", "codeblock", TOOLS)
    assert [c.arguments["code"] for c in four.calls] == ["s = '```'\n"]


def test_codeblock_unclosed_and_empty_blocks_are_errors() -> None:
    out = parse_tool_calls("```python\nprint(1)\n```\n```python\n\n```\n```python\ndef f(:", "codeblock", TOOLS)
    assert [c.arguments["code"] for c in out.calls] == ["print(1)\n"]
    assert out.errors == [
        "code block 2 is empty; put Python code between ```python and ```",
        "unclosed code fence ```python at line 7; close the block with ```",
    ]
    # an unclosed bare fence holding prose is not a call attempt
    assert parse_tool_calls("```\nthe output was (", "codeblock", TOOLS) == ParseOutcome([], [])


def test_codeblock_needs_the_run_python_tool() -> None:
    out = parse_tool_calls("```python\nprint(1)\n```", "codeblock", [RUN_TESTS])
    assert out.calls == [] and "run_python" in out.errors[0]


def test_unknown_format_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="hermes, codeblock"):
        parse_tool_calls("x", "xml", TOOLS)


def test_tool_instructions_describe_every_tool_and_the_format() -> None:
    text = format_tool_instructions("hermes", TOOLS)
    for tool in TOOLS:
        assert json.dumps(tool.to_openai()) in text
    assert "<tool_call>" in text and "</tool_call>" in text
    code = format_tool_instructions("codeblock", TOOLS)
    assert "```python" in code and RUN_PYTHON.description in code


# -- properties -----------------------------------------------------------------------------------------------

ADVERSARIAL = st.lists(
    st.sampled_from(
        ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', ":", ",", "\\", "\n", " ", "```", "```python",
         "```py\n", "name", "arguments", "run_python", "code", "1", "\x00", "é", "def f(", "    ", "\r\n", "null"]
    ),
    max_size=60,
).map("".join)  # fragments of both formats glued in random order


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), ADVERSARIAL), st.sampled_from(["hermes", "codeblock"]))
def test_any_text_never_raises(text: str, fmt: str) -> None:
    out = parse_tool_calls(text, fmt, TOOLS, turn=0)
    assert all(isinstance(e, str) and e for e in out.errors)
    assert len({c.id for c in out.calls}) == len(out.calls)
    for call in out.calls:
        assert call.raw and call.raw in text


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
ARGS = st.fixed_dictionaries(
    {"query": st.text(max_size=30)},
    optional={
        "k": st.integers(),
        "score": st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False)),
        "exact": st.booleans(),
        "tags": st.lists(st.text(max_size=10), max_size=4),
    },
)
VALID_CALLS = st.one_of(
    st.builds(lambda code: ("run_python", {"code": code}), st.text(max_size=80)),
    st.just(("run_tests", {})),
    st.builds(lambda a: ("search", a), ARGS),
)
MALFORMED_BODIES = st.one_of(
    st.just('{"name": "run_python", "arguments": {"code": }}'),
    st.just('{"arguments": {"code": "x"}}'),
    st.builds(lambda n: json.dumps({"name": "zz_" + n}), st.text(max_size=10)),
    st.builds(lambda v: json.dumps({"name": "run_python", "arguments": {"code": v}}),
              JSON_SCALARS.filter(lambda v: not isinstance(v, str))),
    st.builds(lambda v: json.dumps({"name": "search", "arguments": {"query": "q", "k": v}}),
              st.one_of(st.text(), st.booleans(), st.floats(allow_nan=False).filter(lambda f: not f.is_integer()))),
    st.just("not json at all"),
)
FILLER = st.text(alphabet=st.characters(blacklist_characters="<>`"), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), VALID_CALLS, MALFORMED_BODIES, FILLER), max_size=6), st.integers(0, 50))
def test_hermes_round_trip_and_error_count(items: list[tuple[bool, tuple[str, dict], str, str]], turn: int) -> None:
    parts: list[str] = []
    expected: list[tuple[str, str, dict]] = []
    bad = 0
    for i, (is_valid, (name, args), body, filler) in enumerate(items):
        if is_valid:
            parts.append(format_tool_call(ToolCall(id="x", name=name, arguments=args), "hermes"))
            expected.append((f"call_{turn}_{i}", name, args))
        else:
            parts.append(f"<tool_call>{body}</tool_call>")
            bad += 1
        parts.append(filler)
    out = parse_tool_calls("".join(parts), "hermes", TOOLS, turn=turn)
    assert [(c.id, c.name, c.arguments) for c in out.calls] == expected
    assert len(out.errors) == bad


CODE = st.text(alphabet=st.characters(blacklist_characters="`"), min_size=1, max_size=120).filter(str.strip)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(CODE, FILLER), max_size=5))
def test_codeblock_round_trip(blocks: list[tuple[str, str]]) -> None:
    text = "\n".join(
        format_tool_call(ToolCall(id="x", name="run_python", arguments={"code": code}), "codeblock") + "\n" + filler
        for code, filler in blocks
    )
    out = parse_tool_calls(text, "codeblock", TOOLS, turn=1)
    assert out.errors == []
    assert [c.arguments["code"] for c in out.calls] == [c if c.endswith("\n") else c + "\n" for c, _ in blocks]
