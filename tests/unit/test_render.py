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


@pytest.mark.parametrize("template", [None, NO_NEWLINE_TEMPLATE, DROPPING_TEMPLATE])
@pytest.mark.parametrize("odd_turn", [None, 0, 2])
def test_incremental_drift_check_answers_like_the_full_check(smollm2_tokenizer, template,  # type: ignore[no-untyped-def]
                                                           odd_turn) -> None:
    """Turn by turn, DriftCheck (incremental decode + re-tokenize) gives the full check's answer: no drift, a
    template that drops earlier turns (text drift), and a non-canonical tokenization at turn `odd_turn` (token drift
    from that turn on, including turns after it, as the full check reports it)."""
    tok = smollm2_tokenizer if template is None else _with_template(smollm2_tokenizer, template)
    r = ChatRenderer(tok)
    check = r.drift_check()
    msgs = _conversation()
    ids = r.prompt_ids(msgs)
    answers = []
    for turn in range(5):
        reply = f"```python\nprint('hello {turn}')\n```"
        model_ids = list(tok.encode(reply, add_special_tokens=False))
        if turn == odd_turn:
            reply = "hello" + reply
            model_ids = [tok.convert_tokens_to_ids(ch) for ch in "hello"] + model_ids
        obs = [Message(role="user", content=f"exit 0\nhello {turn} ü ✓\n")]
        ids = ids + model_ids + [tok.eos_token_id] + r.suffix_ids(obs)
        msgs = msgs + [Message(role="assistant", content=reply)] + obs
        full = r.check_drift(msgs, ids)
        assert check.check(msgs, ids) == full, f"turn {turn}"
        answers.append(full)
    if template == DROPPING_TEMPLATE:
        assert answers[-1] == (True, True)
    elif odd_turn is not None:
        assert answers[odd_turn:] == [(False, True)] * (5 - odd_turn) and answers[:odd_turn] == [(False, False)] * odd_turn
    else:
        assert answers == [(False, False)] * 5


def test_incremental_drift_check_encodes_only_the_new_part(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = smollm2_tokenizer
    r = ChatRenderer(tok)
    check = r.drift_check()
    msgs = _conversation()
    ids = r.prompt_ids(msgs)
    encoded: list[int] = []
    orig = tok.encode
    real = r.encode

    def spy(text):  # type: ignore[no-untyped-def]
        encoded.append(len(text))
        return real(text)

    r.encode = spy  # type: ignore[method-assign]
    for turn in range(8):
        reply = "x" * 200 + f" {turn}"
        ids = ids + list(orig(reply, add_special_tokens=False)) + [tok.eos_token_id]
        obs = [Message(role="user", content="y" * 200)]
        ids += r.suffix_ids(obs)
        msgs = msgs + [Message(role="assistant", content=reply)] + obs
        assert check.check(msgs, ids) == (False, False)
    assert max(encoded) < 2 * min(encoded[1:])  # the encoded text does not grow with the conversation
