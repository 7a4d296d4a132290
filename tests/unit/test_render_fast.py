"""The renderer's fast paths (direct template render, prompt cache, observation shapes, Rust encode/decode) give the
ids `apply_chat_template` gives, fall back when their start-up check fails, and leave drift detectable."""

from __future__ import annotations

import copy

import pytest

from agentrl.tools import render
from agentrl.tools.render import ChatRenderer
from agentrl.types import Message, ToolSpec

QWEN25 = pytest.importorskip("trl.chat_template_utils").qwen2_5_chat_template
TOOLS = [ToolSpec(name="run_python", description="Run Python code.",
                  parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})]
# renders tool output trimmed: substituting the raw content would differ, so its shapes must not be used
TRIM_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] | trim) + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# redacts one word: content-dependent in a way no probe exercises (the drift check must catch what shapes miss)
REDACTING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if 'SECRET' in m['content'] %}{{ 'REDACTED' }}{% else %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
OUTPUTS = [
    "",
    "exit 0\n3",
    "Traceback (most recent call last):\n  File \"a.py\", line 2, in <module>\n    1/0\nZeroDivisionError\n\n",
    "  leading and trailing whitespace \t\n\n",
    "quotes \" ' {{ x }} {% if %} <tool_response></tool_response> <|im_end|> & \\n \\",
    "ünïcödé ✓ 中文 🙂 \u200b\r\n",
    "\n",
    "x" * 3000,
]


def _template(tok, template):  # type: ignore[no-untyped-def]
    if template is None:
        return tok
    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


def _observations(role: str) -> list[list[Message]]:
    out = []
    for i, text in enumerate(OUTPUTS):
        if role == "tool":
            out.append([Message(role="tool", content=text, name="run_python", tool_call_id=f"call_{i}")])
            out.append([Message(role="tool", content=text, name="run_python", tool_call_id=f"call_{i}_a"),
                        Message(role="tool", content=OUTPUTS[(i + 1) % len(OUTPUTS)], name="run_python",
                                tool_call_id=f"call_{i}_b"),
                        Message(role="user", content=f"error: bad call {i}")])
        else:
            out.append([Message(role="user", content=text)])
    return out


@pytest.mark.parametrize("template", [None, QWEN25])
@pytest.mark.parametrize("role", ["user", "tool"])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_fast_suffix_equals_full_render(smollm2_tokenizer, template, role, tools) -> None:  # type: ignore[no-untyped-def]
    tok = _template(smollm2_tokenizer, template)
    fast, slow = ChatRenderer(tok, tools), ChatRenderer(tok, tools, fast=False)
    for obs in _observations(role):
        assert fast.suffix_ids(obs) == slow.suffix_ids(obs), [m.content[:40] for m in obs]
    assert fast.stats["suffix_slow"] == 0 and fast.stats["suffix_fast"] == len(_observations(role))
    assert slow.stats["suffix_fast"] == 0


@pytest.mark.parametrize("template", [None, QWEN25])
def test_whole_conversation_equals_apply_chat_template(smollm2_tokenizer, template) -> None:  # type: ignore[no-untyped-def]
    """Prompt (cached) + model turns + fast suffixes == the template's own ids for the whole conversation."""
    tok = _template(smollm2_tokenizer, template)
    r = ChatRenderer(tok, TOOLS)
    msgs = [Message(role="system", content="You write Python."), Message(role="user", content="add(a, b)?")]
    ids = r.prompt_ids(msgs)
    check = r.drift_check()
    for turn, text in enumerate(OUTPUTS):
        reply = f"```python\nprint({turn})\n```"
        ids = ids + list(tok.encode(reply, add_special_tokens=False)) + [tok.convert_tokens_to_ids("<|im_end|>")]
        obs = [Message(role="tool", content=text, name="run_python", tool_call_id=f"call_{turn}")]
        ids += r.suffix_ids(obs)
        msgs = msgs + [Message(role="assistant", content=reply)] + obs
        want = tok.apply_chat_template([m.model_dump(exclude_none=True) for m in msgs], tools=r.tools,
                                       add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ids == list(want), f"turn {turn}"
        assert check.check(msgs, ids) == (False, False) == r.check_drift(msgs, ids)


def test_prompt_cache_gives_identical_private_ids(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    r = ChatRenderer(smollm2_tokenizer, TOOLS)
    msgs = [Message(role="system", content="S"), Message(role="user", content="Print 3 ✓")]
    want = list(smollm2_tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in msgs],
                                                      tools=r.tools, add_generation_prompt=True, tokenize=True,
                                                      return_dict=False))
    first = r.prompt_ids(msgs)
    first.append(-1)  # a caller's list is its own: the cache is not changed through it
    again = r.prompt_ids([Message(role="system", content="S"), Message(role="user", content="Print 3 ✓")])
    assert again == want and first[:-1] == want
    assert r.stats["prompt_rendered"] == 1 and r.stats["prompt_cached"] == 1
    assert r.prompt_ids([Message(role="user", content="Print 3 ✓")]) != want  # another conversation, another key
    assert r.stats["prompt_rendered"] == 2


def test_prompt_cache_is_bounded(smollm2_tokenizer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(render, "PROMPT_CACHE_SIZE", 3)
    r = ChatRenderer(smollm2_tokenizer)
    for i in range(10):
        r.prompt_ids([Message(role="user", content=f"task {i}")])
    assert len(r._prompts) == 3


def test_fallback_when_substitution_check_fails(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A template that trims observations: the shape is refused at its first use and every suffix is rendered in
    full (and so still equals the template's ids)."""
    tok = _template(smollm2_tokenizer, TRIM_TEMPLATE)
    fast, slow = ChatRenderer(tok), ChatRenderer(tok, fast=False)
    for obs in _observations("user"):
        assert fast.suffix_ids(obs) == slow.suffix_ids(obs)
    # only the empty output's shape (no slot to fill: a constant) is used; every non-empty one is rendered in full
    assert fast.stats["suffix_fast"] == 1 and fast.stats["suffix_slow"] == len(_observations("user")) - 1
    assert [shape is None for shape in fast._shapes.values()] == [False, True]  # empty first, then the rest


def test_fallback_when_direct_render_unavailable(smollm2_tokenizer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """If transformers' compiled template cannot be used, apply_chat_template renders everything: same ids."""
    def broken(tok, tools):  # type: ignore[no-untyped-def]
        raise ImportError("no compiled template in this transformers")

    want = ChatRenderer(smollm2_tokenizer, TOOLS)
    monkeypatch.setattr(render, "_compiled_template", broken)
    r = ChatRenderer(smollm2_tokenizer, TOOLS)
    assert r._direct is None
    msgs = [Message(role="user", content="hi")]
    obs = [Message(role="tool", content="out\n", name="run_python", tool_call_id="c1")]
    assert r.prompt_ids(msgs) == want.prompt_ids(msgs)
    assert r.suffix_ids(obs) == want.suffix_ids(obs)


def test_direct_render_refused_when_it_differs(smollm2_tokenizer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(render._Direct, "render", lambda self, messages, gen: "something else")
    assert ChatRenderer(smollm2_tokenizer)._direct is None


def test_drift_still_detected_when_a_template_redacts_content(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Content-dependent rendering that no probe exercises: the shape is used, but the per-turn drift check renders
    the whole conversation with the real template and reports the difference."""
    tok = _template(smollm2_tokenizer, REDACTING_TEMPLATE)
    r = ChatRenderer(tok)
    check = r.drift_check()
    msgs = [Message(role="user", content="go")]
    ids = r.prompt_ids(msgs)
    answers = []
    for turn, out in enumerate(["fine", "the SECRET is 4", "fine again"]):
        reply = f"step {turn}"
        ids = ids + list(tok.encode(reply, add_special_tokens=False)) + [tok.eos_token_id]
        obs = [Message(role="user", content=out)]
        ids = ids + r.suffix_ids(obs)
        msgs = msgs + [Message(role="assistant", content=reply)] + obs
        answers.append(check.check(msgs, ids))
        assert answers[-1] == r.check_drift(msgs, ids)
    assert answers == [(False, False), (True, True), (True, True)]
    assert r.stats["suffix_fast"] == 3


def test_rust_decode_and_encode_match_transformers(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    r = ChatRenderer(smollm2_tokenizer)
    for text in OUTPUTS + ["a . b , c 's n't", "<|im_start|>user\nhi<|im_end|>\n"]:
        ids = list(smollm2_tokenizer.encode(text, add_special_tokens=False))
        assert r.encode(text) == ids
        assert r.decode(ids) == smollm2_tokenizer.decode(ids, skip_special_tokens=False)


def test_message_dicts_are_model_dump(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    for m in [Message(role="user", content=""), Message(role="tool", content="x\n", name="n", tool_call_id="c"),
              Message(role="assistant", content="ü", name=None)]:
        assert render._as_dict(m) == m.model_dump(exclude_none=True)
        assert list(render._as_dict(m)) == list(m.model_dump(exclude_none=True))  # same key order for templates
