"""Turning messages into token ids with the model's own chat template. Imports only types.

Owns: the prompt ids of a trajectory, the suffix ids of each tool/env observation, and the per-turn drift check.
Never decodes model output and re-tokenizes it: model tokens are kept exactly as sampled; only env messages are
rendered.

Suffix ids (the TRL trick, made explicit): render a dummy conversation ending in an assistant turn, cut it right
after its last end-of-turn token, render the same conversation plus the observation messages with the generation
prompt, and take the difference. What the model produced ends on its end-of-turn token, so appending the suffix
gives exactly what the template would have rendered, including any newline the template puts after end-of-turn
(verl #6501 dropped it).
"""

from __future__ import annotations

from typing import Any

from agentrl.types import Message, ToolSpec

_DUMMY_USER = "dummy"
_DUMMY_ASSISTANT = "dummy"


class TemplateError(ValueError):
    """The chat template is not prefix-preserving in a way we can slice; names the template problem."""


def _as_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]


class ChatRenderer:
    """Renders messages for one tokenizer (+ optional tools for templates that list them in the system prompt)."""

    def __init__(self, tokenizer: Any, tools: list[ToolSpec] | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise TemplateError("the tokenizer has no chat_template; use an instruct/chat checkpoint")
        self.tok = tokenizer
        self.tools = [t.to_openai() for t in tools] if tools else None
        self.end_of_turn_ids = self._end_of_turn_ids()
        self._suffix_prefix = self._dummy_prefix("assistant")
        self._user_prefix = self._dummy_prefix("user")

    # -- low level ------------------------------------------------------------------------------------------
    def _template(self, messages: list[dict[str, Any]], *, gen_prompt: bool, tokenize: bool) -> Any:
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

    # -- public ---------------------------------------------------------------------------------------------
    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The ids of the opening conversation, with the generation prompt for the first assistant turn."""
        return list(self._template(_as_dicts(messages), gen_prompt=True, tokenize=True))

    def suffix_ids(self, observation: list[Message]) -> list[int]:
        """Ids to append after a model turn that ended on end-of-turn: the observation messages + the next
        assistant generation prompt.

        Templates that rewrite earlier assistant turns (e.g. strip reasoning) are not prefix-preserving after an
        assistant message; then the suffix is taken after a user message instead, and the per-turn drift check
        reports that the template would render the conversation differently.
        """
        obs = _as_dicts(observation)
        for role, prefix in (("assistant", self._suffix_prefix), ("user", self._user_prefix)):
            full = list(self._template(self._dummy(role) + obs, gen_prompt=True, tokenize=True))
            if full[: len(prefix)] == prefix:
                return full[len(prefix) :]
        raise TemplateError("the chat template is not prefix-preserving: rendering an observation changed "
                            "earlier tokens even after a user message; use a template that appends messages")

    def render_text(self, messages: list[Message], *, gen_prompt: bool) -> str:
        return str(self._template(_as_dicts(messages), gen_prompt=gen_prompt, tokenize=False))

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
        return str(self.tok.decode(ids, skip_special_tokens=False))

    def strip_end_of_turn(self, ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] in self.end_of_turn_ids else ids


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
      it, exactly like the full check.
    """

    def __init__(self, renderer: ChatRenderer) -> None:
        self.r = renderer
        self._text = ""
        self._decoded = 0  # ids decoded into _text
        self._ok_ids = 0  # ids[:_ok_ids] verified against the tokenization of _text[:_ok_chars]
        self._ok_chars = 0
        self._special = set(renderer.end_of_turn_ids) | set(getattr(renderer.tok, "all_special_ids", []) or [])

    def check(self, messages: list[Message], ids: list[int]) -> tuple[bool, bool]:
        rendered = self.r.render_text(messages, gen_prompt=True)
        self._decode_new(ids)
        if rendered != self._text:
            return True, True
        tail_ids = ids[self._ok_ids:]
        token_drift = list(self.r.tok.encode(rendered[self._ok_chars:], add_special_tokens=False)) != tail_ids
        if not token_drift:
            self._advance(ids)
        return False, token_drift

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
