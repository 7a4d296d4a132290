"""Chat rendering: suffix ids equal the template's own rendering, and the drift check tells apart a template that
extends the context from one that does not."""

from __future__ import annotations

import copy

import pytest

from agentrl.tools.render import ChatRenderer, TemplateError
from agentrl.types import Message

NO_NEWLINE_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# a template that drops earlier assistant turns (like templates that strip reasoning): not prefix-preserving
DROPPING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _conversation() -> list[Message]:
    return [Message(role="system", content="You write Python."), Message(role="user", content="add(a, b)?")]


def _with_template(tok, template: str):  # type: ignore[no-untyped-def]
    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


@pytest.mark.parametrize("template", [None, NO_NEWLINE_TEMPLATE])
@pytest.mark.parametrize("role", ["user", "tool"])
def test_suffix_equals_template_rendering(smollm2_tokenizer, template, role) -> None:  # type: ignore[no-untyped-def]
    tok = smollm2_tokenizer if template is None else _with_template(smollm2_tokenizer, template)
    r = ChatRenderer(tok)
    msgs = _conversation()
    ids = r.prompt_ids(msgs)
    assert ids == list(tok.apply_chat_template([m.model_dump(exclude_none=True) for m in msgs],
                                               add_generation_prompt=True, tokenize=True, return_dict=False))
    for turn in range(3):
        reply = f"```python\ndef add(a, b):\n    return a + b  # v{turn}\n```"
        model_ids = list(tok.encode(reply, add_special_tokens=False)) + [tok.eos_token_id]
        obs = [Message(role=role, content=f"exit code 0\nstdout: {turn}\n", name="run_python" if role == "tool" else None)]
        ids = ids + model_ids + r.suffix_ids(obs)
        msgs = msgs + [Message(role="assistant", content=reply)] + obs
        expected = tok.apply_chat_template([m.model_dump(exclude_none=True) for m in msgs],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ids == list(expected), f"turn {turn}: suffix ids differ from the template's rendering"
        assert r.check_drift(msgs, ids) == (False, False)


def test_smollm2_newline_after_end_of_turn_is_kept(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    r = ChatRenderer(smollm2_tokenizer)
    suffix = smollm2_tokenizer.decode(r.suffix_ids([Message(role="user", content="out")]))
    assert suffix == "\n<|im_start|>user\nout<|im_end|>\n<|im_start|>assistant\n"


def test_drift_detected_for_non_prefix_preserving_template(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = _with_template(smollm2_tokenizer, DROPPING_TEMPLATE)
    r = ChatRenderer(tok)
    msgs = _conversation()
    ids = r.prompt_ids(msgs)
    for turn in range(2):
        reply = f"step {turn}"
        ids += list(tok.encode(reply, add_special_tokens=False)) + [tok.eos_token_id]
        obs = [Message(role="user", content=f"obs {turn}")]
        ids += r.suffix_ids(obs)
        msgs += [Message(role="assistant", content=reply)] + obs
    text_drift, token_drift = r.check_drift(msgs, ids)
    assert text_drift and token_drift


def test_retokenize_mismatch_without_text_drift(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Sampled ids that are a non-canonical tokenization of their text: the text matches, the ids would not."""
    tok = smollm2_tokenizer
    r = ChatRenderer(tok)
    msgs = _conversation()
    ids = r.prompt_ids(msgs)
    word = "hello"
    odd = [tok.convert_tokens_to_ids(ch) for ch in word]  # one token per character
    assert odd != tok.encode(word, add_special_tokens=False)
    obs = [Message(role="user", content="ok")]
    ids += odd + [tok.eos_token_id] + r.suffix_ids(obs)
    msgs += [Message(role="assistant", content=word)] + obs
    assert r.check_drift(msgs, ids) == (False, True)


def test_template_without_end_of_turn_rejected(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = _with_template(smollm2_tokenizer, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(TemplateError, match="end-of-turn"):
        ChatRenderer(tok)
