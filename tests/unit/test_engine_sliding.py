"""The local engine on a sliding-window model (a tiny random Gemma 3, window 6): batched rows longer than the
window, left padding and a prefix-cache second turn give exactly what transformers' own generate (with its real
sliding-window cache) gives, and the window matters for these inputs (without it the logprobs differ)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from agentrl.engine.local import LocalEngine
from agentrl.types import SamplingParams

WINDOW = 6


def _tiny_gemma(directory: Path, window: int = WINDOW) -> Path:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GenerationConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=window, max_position_embeddings=256,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], initializer_range=0.1,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    model = Gemma3ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model.save_pretrained(directory)
    return directory


def _reference(path: Path, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    return tokens, [float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(out.scores, tokens)]


def test_sliding_window_model_matches_transformers_generate(tmp_path: Path) -> None:
    path = _tiny_gemma(tmp_path / "gemma")
    prompts = [[2, 5, 9], [2, *range(10, 23)], [2, *range(30, 39)]]  # 3, 14 and 10 tokens: two beyond the window
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=[-1])

    async def run() -> tuple[list[list[int]], list[list[float]], list[int], list[float]]:
        engine = LocalEngine(path, max_batch_size=4, batch_wait_ms=200)
        try:
            first = await asyncio.gather(*[engine.generate(p, sampling, session_id=f"s{i}")
                                           for i, p in enumerate(prompts)])
            again = await engine.generate(prompts[1] + first[1].output_ids + [40, 41], sampling, session_id="s1")
            assert engine.stats.cached_tokens > 0  # the second turn reused the first turn's cache
        finally:
            await engine.close()
        return [g.output_ids for g in first], [g.logprobs for g in first], again.output_ids, again.logprobs

    tokens, logprobs, tokens2, logprobs2 = asyncio.run(run())
    turn2 = prompts[1] + tokens[1] + [40, 41]
    for ids, got, got_lp in [*zip(prompts, tokens, logprobs), (turn2, tokens2, logprobs2)]:
        want, want_lp = _reference(path, ids, 8)
        assert got == want
        assert got_lp == pytest.approx(want_lp, abs=1e-4)
    windowless = _tiny_gemma(tmp_path / "windowless", window=4096)  # same weights (same seed), no effective window
    assert (_last_logprobs(windowless, turn2) - _last_logprobs(path, turn2)).abs().max() > 0.05


def _last_logprobs(path: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)
