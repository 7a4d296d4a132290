"""Generation engines behind one protocol (`base.GenerationEngine`): `local` (transformers, in-process, batched) and
the HTTP clients `sglang` and `vllm` (thin faces of `http_engine.HTTPEngine`, over `http`, `routing` and
`weight_gate`). The CPU stand-in servers behind `agentrl engine serve` and the loaders of the real servers'
request contracts are the subpackage `standin`; no engine imports it."""

from agentrl.engine.base import GenerationEngine

__all__ = ["GenerationEngine"]
