"""Turning messages into token ids with the model's own chat template. Imports only types.

Owns: the prompt ids of a trajectory, the suffix ids of each tool/env observation, and the per-turn drift check.
Never decodes model output and re-tokenizes it: model tokens are kept exactly as sampled; only env messages are
rendered.

Total on any text: env messages carry policy-produced text (tool output, test messages), which may hold code points
no tokenizer can encode (surrogates, e.g. from a JSON "\\ud800" escape). Every message field and every text given to
`encode` goes through `safe_text` first: each surrogate becomes its escape `\\udXXX` (six ASCII characters), the rest
(NUL included) is unchanged. The model sees what was there; the stored messages keep the original text.

Suffix ids (the TRL trick, made explicit): render a dummy conversation ending in an assistant turn, cut it right
after its last end-of-turn token, render the same conversation plus the observation messages with the generation
prompt, and take the difference. What the model produced ends on its end-of-turn token, so appending the suffix
gives exactly what the template would have rendered, including any newline the template puts after end-of-turn
(verl #6501 dropped it).

Speed (thousands of trajectories share one event loop, so every render is on the hot path). Three fast paths, each
checked against `tokenizer.apply_chat_template` when the renderer is built (or when a new observation shape is first
seen) and skipped when the check fails, so the ids are the same either way:

- direct template: the compiled jinja template is rendered with the same inputs `apply_chat_template` builds
  (messages as plain dicts, tools, special tokens), without its per-call conversion of every message (`_Direct`);
- prompt cache: the prompt ids per opening conversation (a group's G samples and its retries share them);
- observation shapes: the suffix text of an observation depends on its messages' roles and which fields are set;
  it is rendered once per shape with sentinel values and later filled in by string substitution, and only the
  suffix text is tokenized (`_Shape`). A shape is used only after it reproduced the template's suffix ids for probe
  values (empty-looking, multi-line, padded, quotes/braces/markup, non-ASCII, long), and the per-turn drift check
  renders the whole conversation with the real template, so a template that renders some content differently from
  the probes shows up as drift, never silently.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.types import Message, ToolSpec

log = logging.getLogger("agentrl.tools.render")

_DUMMY_USER = "dummy"
_DUMMY_ASSISTANT = "dummy"
_FIELDS = ("content", "name", "tool_call_id")
_SENTINEL = "\ue000agentrl-slot-{}\ue001"  # private-use characters: no template writes them
_SLOT = re.compile("\ue000agentrl-slot-([0-9]+)\ue001")
_PROBE_CONTENTS = (
    "x",
    "exit code 0\nstdout:\nline one\n\nline three\n",
    "  padded \t\n",
    " \n",
    "quotes \" ' `` {{ braces }} {% raw %} <tag attr=\"1\"> & \\ backslash </tool_response> [/INST] #",
    "ünïcödé ✓ 中文 🙂 \u200b",
    "<tool_response>\n{\"ok\": true}\n</tool_response>",
    "Traceback (most recent call last):\n  File \"x.py\", line 1\n" * 20,
)
_PROBE_NAMES = ("run_python", "a", "tool-name_2 with space")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PROBE_IDS = ("call_0", "c", "call-7f3a9 x")
PROMPT_CACHE_SIZE = 4096
MAX_SHAPES = 256


class TemplateError(ValueError):
    """The chat template is not prefix-preserving in a way we can slice; names the template problem."""


_MESSAGE_FIELDS = tuple(Message.model_fields)


def safe_text(text: str) -> str:
    """`text` with every surrogate code point written as its escape `\\udXXX`, so any tokenizer can encode it (a
    surrogate is not a Unicode scalar value: UTF-8 and the Rust tokenizers refuse it). Linear; other text as is."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _as_dict(message: Message) -> dict[str, Any]:
    """`message.model_dump(exclude_none=True)` (its fields are plain strings), without pydantic's serializer, with
    each field made encodable (`safe_text`)."""
    return {k: safe_text(v) for k in _MESSAGE_FIELDS if (v := getattr(message, k)) is not None}


def _as_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    return [_as_dict(m) for m in messages]


def message_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    """The template's input for `messages` (plain dicts, `model_dump(exclude_none=True)`): picklable, cheap to send."""
    return _as_dicts(messages)


def _message_key(message: Message) -> tuple[str, str, str | None, str | None]:
    return message.role, message.content, message.name, message.tool_call_id


class _Direct:
    """The tokenizer's compiled chat template called directly, with the inputs `apply_chat_template` would build.

    `build` returns None (callers then use `apply_chat_template`) when transformers does not expose the compiled
    template, or when the direct render or its tokenization differs from `apply_chat_template` on probe
    conversations."""

    def __init__(self, compiled: Any, tools: list[dict[str, Any]] | None, specials: dict[str, Any],
                 encode: Callable[[str], list[int]]) -> None:
        self._compiled = compiled
        self._tools = tools
        self._specials = specials
        self.encode = encode

    def render(self, messages: list[dict[str, Any]], gen_prompt: bool) -> str:
        return str(self._compiled.render(messages=messages, tools=self._tools, documents=None,
                                         add_generation_prompt=gen_prompt, **self._specials))

    @classmethod
    def build(cls, tok: Any, tools: list[dict[str, Any]] | None, probes: list[list[dict[str, Any]]]) -> _Direct | None:
        try:
            compiled, plain = _compiled_template(tok, tools)
            direct = cls(compiled, plain(tools), plain(dict(tok.special_tokens_map)), _encoder(tok))
            for messages in probes:
                for gen in (True, False):
                    want = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen,
                                                   tokenize=False, return_dict=False)
                    text = direct.render(messages, gen)
                    ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=True,
                                                  return_dict=False)
                    if text != want or direct.encode(text) != list(ids):
                        log.info("chat template: direct render differs from apply_chat_template; using the latter")
                        return None
        except Exception as exc:  # noqa: BLE001 - any doubt: the slow, exact path
            log.info("chat template: no direct render (%s: %s); using apply_chat_template", type(exc).__name__, exc)
            return None
        return direct


def _compiled_template(tok: Any, tools: list[dict[str, Any]] | None) -> tuple[Any, Callable[[Any], Any]]:
    """transformers' cached compiled template for this tokenizer and its plain-data converter (private helpers of
    transformers: any change there makes `_Direct.build` fail its check, and apply_chat_template is used)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template, _plain_template_data

    return _compile_jinja_template(tok.get_chat_template(None, tools)), _plain_template_data


def _encoder(tok: Any) -> Callable[[str], list[int]]:
    """`tok.encode(text, add_special_tokens=False)`, through the Rust tokenizer when it gives the same ids."""
    slow = lambda text: list(tok.encode(text, add_special_tokens=False))  # noqa: E731
    backend = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
    if backend is None:
        return slow
    fast = lambda text: backend.encode(text, add_special_tokens=False).ids  # noqa: E731
    probes = [p for p in _PROBE_CONTENTS] + [" leading space", "<|im_start|>user\nhi<|im_end|>\n", ""]
    try:
        if all(fast(p) == slow(p) for p in probes):
            return fast
    except Exception:  # noqa: BLE001
        pass
    return slow


def _decoder(tok: Any, *, rust: bool = True) -> Callable[[list[int]], str]:
    """`tok.decode(ids, skip_special_tokens=False)`, through the Rust tokenizer when transformers would not post-process
    its text (no clean-up of tokenization spaces) and it gives the same text on probes."""
    slow = lambda ids: str(tok.decode(ids, skip_special_tokens=False))  # noqa: E731
    backend = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
    if not rust or backend is None or getattr(tok, "clean_up_tokenization_spaces", False):
        return slow
    fast = lambda ids: backend.decode(ids, skip_special_tokens=False)  # noqa: E731
    texts = list(_PROBE_CONTENTS) + ["a . b , c ? d ! e 's f n't g 'm h 've i 're", "<|im_start|>user\nhi<|im_end|>"]
    try:
        probes = [list(tok.encode(t, add_special_tokens=False)) for t in texts]
        probes.append([tok.eos_token_id] if tok.eos_token_id is not None else [])
        if all(fast(p) == slow(p) for p in probes):
            return fast
    except Exception:  # noqa: BLE001
        pass
    return slow


@dataclass(frozen=True)
class _Shape:
    """The suffix text of one observation shape: literal parts around (message index, field) slots."""

    parts: tuple[str, ...]
    slots: tuple[tuple[int, str], ...]

    def fill(self, messages: list[dict[str, Any]]) -> str:
        out = [self.parts[0]]
        for (i, name), part in zip(self.slots, self.parts[1:], strict=True):
            out.append(messages[i][name])
            out.append(part)
        return "".join(out)


class ChatRenderer:
    """Renders messages for one tokenizer (+ optional tools for templates that list them in the system prompt).

    `fast=False` turns the fast paths off (every render goes through `apply_chat_template`); `stats` counts which
    path each suffix took. Its caches are not locked: use it from one thread (the event loop)."""

    def __init__(self, tokenizer: Any, tools: list[ToolSpec] | None = None, *, fast: bool = True) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise TemplateError("the tokenizer has no chat_template; use an instruct/chat checkpoint")
        self.tok = tokenizer
        self.tool_specs = list(tools or [])  # what a copy of this renderer (e.g. in a worker process) is built from
        self.fast = fast
        self.tools = [t.to_openai() for t in tools] if tools else None
        self.end_of_turn_ids = self._end_of_turn_ids()
        self._direct = _Direct.build(tokenizer, self.tools, _probe_conversations()) if fast else None
        self._encode = self._direct.encode if self._direct else _encoder(tokenizer)
        self._decode = _decoder(tokenizer, rust=fast)
        self._suffix_prefix = self._dummy_prefix("assistant")
        self._user_prefix = self._dummy_prefix("user")
        self._prefix_text = self._dummy_prefix_text() if fast else None
        self._prompts: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._shapes: dict[tuple[Any, ...], _Shape | None] = {}
        self.stats = {"suffix_fast": 0, "suffix_slow": 0, "prompt_cached": 0, "prompt_rendered": 0}

    # -- low level ------------------------------------------------------------------------------------------
    def _template(self, messages: list[dict[str, Any]], *, gen_prompt: bool, tokenize: bool) -> Any:
        if self._direct is not None:
            text = self._direct.render(messages, gen_prompt)
            return self._encode(text) if tokenize else text
        return self.tok.apply_chat_template(
            messages,
            tools=self.tools,
            add_generation_prompt=gen_prompt,
            tokenize=tokenize,
            return_dict=False,
        )

    def _end_of_turn_ids(self) -> list[int]:
        ids = {self.tok.eos_token_id} if self.tok.eos_token_id is not None else set()
        for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
            tid = self.tok.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.tok.unk_token_id and tid >= 0:
                ids.add(tid)
        return sorted(ids)

    def _dummy(self, role: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": _DUMMY_USER}] + ([{"role": role, "content": _DUMMY_ASSISTANT}]
                                                               if role == "assistant" else [])

    def _dummy_prefix(self, role: str = "assistant") -> list[int]:
        ids = list(self._template(self._dummy(role), gen_prompt=False, tokenize=True))
        eot = [i for i, t in enumerate(ids) if t in self.end_of_turn_ids]
        if not eot:
            raise TemplateError("the chat template renders no end-of-turn token after a message")
        return ids[: eot[-1] + 1]

    def _dummy_prefix_text(self) -> str | None:
        """The text whose ids are the assistant dummy prefix (it ends on an end-of-turn token's text), or None when
        the template's text cannot be cut there (then every suffix takes the full path)."""
        text = str(self._template(self._dummy("assistant"), gen_prompt=False, tokenize=False))
        marks = [m for m in self.tok.convert_ids_to_tokens(self.end_of_turn_ids) if isinstance(m, str) and m]
        cut = max((text.rfind(m) + len(m) for m in marks if m in text), default=-1)
        if cut < 0 or self._encode(text[:cut]) != self._suffix_prefix:
            return None
        return text[:cut]

    # -- public ---------------------------------------------------------------------------------------------
    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The ids of the opening conversation, with the generation prompt for the first assistant turn. Cached
        per conversation (a group's samples and retries render it once); each caller gets its own list."""
        key = tuple(_message_key(m) for m in messages)
        ids = self._prompts.get(key)
        if ids is None:
            ids = list(self._template(_as_dicts(messages), gen_prompt=True, tokenize=True))
            self._prompts[key] = ids
            if len(self._prompts) > PROMPT_CACHE_SIZE:
                self._prompts.popitem(last=False)
            self.stats["prompt_rendered"] += 1
        else:
            self._prompts.move_to_end(key)
            self.stats["prompt_cached"] += 1
        return list(ids)

    def suffix_ids(self, observation: list[Message]) -> list[int]:
        """Ids to append after a model turn that ended on end-of-turn: the observation messages + the next
        assistant generation prompt.

        Templates that rewrite earlier assistant turns (e.g. strip reasoning) are not prefix-preserving after an
        assistant message; then the suffix is taken after a user message instead, and the per-turn drift check
        reports that the template would render the conversation differently.
        """
        obs = _as_dicts(observation)
        shape = self._shape(obs)
        if shape is not None:
            self.stats["suffix_fast"] += 1
            return list(self._encode(shape.fill(obs)))
        self.stats["suffix_slow"] += 1
        return self._suffix_full(obs)

    def _suffix_full(self, obs: list[dict[str, Any]]) -> list[int]:
        for role, prefix in (("assistant", self._suffix_prefix), ("user", self._user_prefix)):
            full = list(self._template(self._dummy(role) + obs, gen_prompt=True, tokenize=True))
            if full[: len(prefix)] == prefix:
                return full[len(prefix) :]
        raise TemplateError("the chat template is not prefix-preserving: rendering an observation changed "
                            "earlier tokens even after a user message; use a template that appends messages")

    # -- observation shapes ---------------------------------------------------------------------------------
    def _shape(self, obs: list[dict[str, Any]]) -> _Shape | None:
        """The verified shape of this observation, or None (full render) when there is none."""
        if self._prefix_text is None:
            return None
        key = tuple((m["role"], tuple(_state(m.get(f)) for f in _FIELDS)) for m in obs)
        if key not in self._shapes:
            if len(self._shapes) >= MAX_SHAPES:
                return None
            self._shapes[key] = self._learn_shape(obs)
        return self._shapes[key]

    def _learn_shape(self, obs: list[dict[str, Any]]) -> _Shape | None:
        slotted: list[dict[str, Any]] = []
        slots: list[tuple[int, str]] = []
        for i, m in enumerate(obs):
            m = dict(m)
            for f in _FIELDS:
                if m.get(f):
                    m[f] = _SENTINEL.format(len(slots))
                    slots.append((i, f))
            slotted.append(m)
        try:
            text = str(self._template(self._dummy("assistant") + slotted, gen_prompt=True, tokenize=False))
        except Exception:  # noqa: BLE001 - the full path raises the template's own error
            return None
        assert self._prefix_text is not None
        if not text.startswith(self._prefix_text):
            return None
        pieces = _SLOT.split(text[len(self._prefix_text):])  # literal, slot number, literal, ...
        parts, order = tuple(pieces[0::2]), tuple(slots[int(k)] for k in pieces[1::2])
        shape = _Shape(parts, order)  # a field the template does not write has no slot (probes vary it too)
        if not all(self._encode(shape.fill(p)) == self._suffix_full(p) for p in _probes(obs, slots)):
            log.info("chat template: observation shape %s is not substitutable; rendering it in full",
                     [m["role"] for m in obs])
            return None
        return shape

    def render_text(self, messages: list[Message], *, gen_prompt: bool) -> str:
        return self.render_dicts(_as_dicts(messages), gen_prompt=gen_prompt)

    def render_dicts(self, messages: list[dict[str, Any]], *, gen_prompt: bool) -> str:
        """The template's text for messages already converted to plain dicts (`model_dump(exclude_none=True)`)."""
        return str(self._template(messages, gen_prompt=gen_prompt, tokenize=False))

    def encode(self, text: str) -> list[int]:
        """`tokenizer.encode(safe_text(text), add_special_tokens=False)` (the tokenization `apply_chat_template`
        uses)."""
        return list(self._encode(safe_text(text)))

    def check_drift(self, messages: list[Message], ids: list[int]) -> tuple[bool, bool]:
        """Compare our exact ids with what re-templating the conversation would give.

        Returns (text_drift, token_drift): text_drift means the template renders the conversation (assistant
        turns as decoded text) differently from decode(ids), i.e. our context is not what the template would
        build; token_drift means re-tokenizing that rendering gives different ids (harmless for us since we keep
        the sampled ids, but it is exactly the drift that decode/re-tokenize pipelines suffer).
        """
        rendered = self.render_text(messages, gen_prompt=True)
        ours = self.tok.decode(ids, skip_special_tokens=False)
        text_drift = rendered != ours
        token_drift = text_drift or list(self.tok.encode(rendered, add_special_tokens=False)) != list(ids)
        return text_drift, token_drift

    def drift_check(self) -> DriftCheck:
        """A per-trajectory incremental `check_drift` (same answers, linear work per trajectory)."""
        return DriftCheck(self)

    def decode(self, ids: list[int]) -> str:
        """`tokenizer.decode(ids, skip_special_tokens=False)`."""
        return self._decode(ids)

    def strip_end_of_turn(self, ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] in self.end_of_turn_ids else ids


def _state(value: Any) -> str:
    return "absent" if value is None else ("set" if value else "empty")


def _probes(obs: list[dict[str, Any]], slots: list[tuple[int, str]]) -> list[list[dict[str, Any]]]:
    """Probe observations of the same shape: every slot filled with each probe value of its field in turn."""
    values = {"content": _PROBE_CONTENTS, "name": _PROBE_NAMES, "tool_call_id": _PROBE_IDS}
    out = [obs]
    rounds = max((len(values[f]) for _, f in slots), default=0)
    for r in range(rounds):
        probe = [dict(m) for m in obs]
        for n, (i, f) in enumerate(slots):
            vs = values[f]
            probe[i][f] = vs[(r + n) % len(vs)]
        out.append(probe)
    return out


def _probe_conversations() -> list[list[dict[str, Any]]]:
    """Conversations on which the direct template render must equal `apply_chat_template`."""
    return [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "You write Python."}, {"role": "user", "content": _PROBE_CONTENTS[4]},
         {"role": "assistant", "content": "```python\nprint(1)\n```"},
         {"role": "tool", "content": _PROBE_CONTENTS[1], "name": "run_python", "tool_call_id": "call_0"},
         {"role": "user", "content": _PROBE_CONTENTS[5]}],
    ]


class DriftCheck:
    """`ChatRenderer.check_drift` for one growing conversation, without re-decoding and re-tokenizing it all.

    Each call gets the whole conversation (messages, ids) as it has grown since the last call. What stays per turn:
    rendering the messages with the template (a string; the only way to see a template that rewrites earlier
    turns) and comparing it with our decoded text. What became incremental:

    - decode: only the ids added since the last call are decoded and appended (segments end on end-of-turn or on
      the generation prompt, so they are whole characters; a segment that is not falls back to a full decode);
    - re-tokenize: only the text after the last verified *checkpoint* is encoded and compared with the ids after
      it. A checkpoint is the end of the last special token (end-of-turn) of a verified span: the tokenizer splits
      special tokens out before anything else, so the text on either side is tokenized independently and the
      verified prefix can never change. A span that drifted is never checkpointed, so later calls still report
      it, exactly like the full check;
    - the messages' plain dicts (the template's input) are converted once per message, not once per turn.
    """

    def __init__(self, renderer: ChatRenderer) -> None:
        self.r = renderer
        self._text = ""
        self._decoded = 0  # ids decoded into _text
        self._ok_ids = 0  # ids[:_ok_ids] verified against the tokenization of _text[:_ok_chars]
        self._ok_chars = 0
        self._special = set(renderer.end_of_turn_ids) | set(getattr(renderer.tok, "all_special_ids", []) or [])
        self._messages: list[Message] = []  # the messages whose dicts are in _dicts (same objects, same order)
        self._dicts: list[dict[str, Any]] = []

    def check(self, messages: list[Message], ids: list[int]) -> tuple[bool, bool]:
        return self.check_dicts(self._as_dicts(messages), ids)

    def check_dicts(self, dicts: list[dict[str, Any]], ids: list[int]) -> tuple[bool, bool]:
        """`check` for messages already converted by `message_dicts` (each call: the conversation so far)."""
        rendered = self.r.render_dicts(dicts, gen_prompt=True)
        self._decode_new(ids)
        if rendered != self._text:
            return True, True
        tail_ids = ids[self._ok_ids:]
        token_drift = self.r.encode(rendered[self._ok_chars:]) != tail_ids
        if not token_drift:
            self._advance(ids)
        return False, token_drift

    def _as_dicts(self, messages: list[Message]) -> list[dict[str, Any]]:
        n = len(self._messages)
        if len(messages) < n or any(a is not b for a, b in zip(messages, self._messages, strict=False)):
            self._messages, self._dicts, n = [], [], 0  # not the conversation seen so far: convert it all
        self._messages.extend(messages[n:])
        self._dicts.extend(_as_dict(m) for m in messages[n:])
        return self._dicts

    def _decode_new(self, ids: list[int]) -> None:
        if len(ids) < self._decoded:
            raise ValueError("DriftCheck: the conversation's ids shrank; use one DriftCheck per trajectory")
        piece = self.r.decode(ids[self._decoded:])
        if "\ufffd" in piece:  # cut inside a character: decode the whole thing once
            self._text = self.r.decode(ids)
        else:
            self._text += piece
        self._decoded = len(ids)

    def _advance(self, ids: list[int]) -> None:
        last = next((i for i in range(len(ids) - 1, self._ok_ids - 1, -1) if ids[i] in self._special), None)
        if last is None:
            return
        span = self.r.decode(ids[self._ok_ids:last + 1])
        if self._text[self._ok_chars:self._ok_chars + len(span)] != span:
            return  # decoding is not segment-additive here: keep the old checkpoint (still correct, just longer)
        self._ok_ids, self._ok_chars = last + 1, self._ok_chars + len(span)


def drift_answers(renderer: ChatRenderer, dicts: list[dict[str, Any]], ids: list[int],
                  marks: list[tuple[int, int, int]]) -> list[tuple[bool, bool]]:
    """The per-turn answers of a `DriftCheck` run after the fact: `marks` holds, per checked turn, (turn index,
    messages so far, ids so far); the conversation only grows, so each turn's check sees `dicts[:m]`, `ids[:n]`,
    exactly what the check saw (or would have seen) during the episode."""
    check = DriftCheck(renderer)
    return [check.check_dicts(dicts[:m], ids[:n]) for _, m, n in marks]
