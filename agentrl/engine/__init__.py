"""Generation engines behind one protocol (`base.GenerationEngine`): `local` (transformers, in-process, batched) and
the HTTP clients `sglang` and `vllm` (thin faces of `http_engine.HTTPEngine`, over `http`, `routing` and
`weight_gate`); `standin*` are the CPU stand-in servers behind `agentrl engine serve`."""

from agentrl.engine.base import GenerationEngine

__all__ = ["GenerationEngine"]
