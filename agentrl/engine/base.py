"""The GenerationEngine protocol: token ids in, token ids + logprobs out. Imports only types/errors.

An engine never sees text or chat templates; the runner owns rendering. Every generated token is tagged with the
`weight_version` that produced it (bumped by `update_weights`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from agentrl.types import Generation, SamplingParams


@runtime_checkable
class GenerationEngine(Protocol):
    #: a short name recorded in trajectory meta, e.g. "local" or "sglang"
    name: str

    @property
    def weight_version(self) -> int: ...

    @property
    def context_window(self) -> int:
        """Max prompt + generated tokens per sequence."""
        ...

    async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        """Generate a continuation of `input_ids`. `session_id` identifies the trajectory (sticky routing)."""
        ...

    async def update_weights(self, source: Any, version: int) -> None:
        """Load new weights (a state dict / model in-process, or a checkpoint path) tagged `version`."""
        ...

    # LoRA runs (`weight_sync: adapter`) also need `async load_adapter(path, version)`: the local, sglang and vllm
    # engines apply a PEFT adapter dir on top of their base weights; an engine without it is refused with a fix.

    async def health(self) -> bool: ...

    async def close(self) -> None: ...

    def info(self) -> dict[str, Any]:
        """Engine name, version, model path: recorded in every trajectory's meta."""
        ...
