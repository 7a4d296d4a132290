"""Generation engines behind one protocol: `local` (transformers, in-process, batched) and `sglang` (HTTP)."""

from agentrl.engine.base import GenerationEngine

__all__ = ["GenerationEngine"]
