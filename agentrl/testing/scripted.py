"""A scripted GenerationEngine: replies are given as text, tokenized once, returned as exact ids with fixed logprobs.

Fakes only the model: everything else (runner, sandbox, env, store) runs for real in tests that use it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from agentrl.types import FinishReason, Generation, SamplingParams

Reply = Callable[[str, int, list[int]], str]


class ScriptedEngine:
    """`replies(session_id, turn_index, input_ids) -> text`; the end-of-turn id is appended unless the
    per-call max_new_tokens cuts the reply first (then finish_reason is "length")."""

    name = "scripted"

    def __init__(self, tokenizer: Any, replies: Reply | list[str], *, eos_id: int | None = None,
                 context_window: int = 8192, logprob: float = -0.25) -> None:
        self.tok = tokenizer
        self._replies = replies if callable(replies) else (lambda _s, i, _ids: replies[min(i, len(replies) - 1)])
        self.eos_token_ids = [eos_id if eos_id is not None else tokenizer.eos_token_id]
        self._context_window = context_window
        self._logprob = logprob
        self._turns: dict[str, int] = defaultdict(int)
        self.calls: list[tuple[str, list[int]]] = []
        self._version = 0

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def context_window(self) -> int:
        return self._context_window

    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        self.calls.append((session_id, list(input_ids)))
        text = self._replies(session_id, self._turns[session_id], input_ids)
        self._turns[session_id] += 1
        ids = list(self.tok.encode(text, add_special_tokens=False)) + [self.eos_token_ids[0]]
        finish: FinishReason = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        lps = [self._logprob - 0.001 * (i % 7) for i in range(len(ids))]
        return Generation(output_ids=ids, logprobs=lps, finish_reason=finish, weight_version=self._version)

    async def update_weights(self, source: Any, version: int) -> None:
        self._version = version

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def info(self) -> dict[str, Any]:
        return {"engine": self.name}


def hermes_call(name: str, **args: Any) -> str:
    """A scripted reply's tool call in the hermes format (`<tool_call>{"name", "arguments"}</tool_call>`)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def single_hunk_edit(diff: str) -> tuple[str, str, str]:
    """(file, old text, new text) of a one-file, single-hunk unified diff: what a scripted policy passes to a
    str_replace editor to apply it."""
    lines = diff.splitlines()
    path = lines[0].split(" b/", 1)[1]
    body = lines[lines.index(next(ln for ln in lines if ln.startswith("@@"))) + 1:]
    old = "\n".join(ln[1:] for ln in body if ln[:1] in (" ", "-"))
    new = "\n".join(ln[1:] for ln in body if ln[:1] in (" ", "+"))
    return path, old, new
