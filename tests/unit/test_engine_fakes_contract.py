"""The simulated engine (agentrl.testing, behind bench_scale and the scale tests) checked against the real one.

The same checks run on LocalEngine (the real transformers code path, on the tiny random model) and on
SimulatedEngine: what a Generation carries, how it ends, which weight version tags it, and how the per-session
prefix cache reuses tokens (the same count, by the same rule) and forgets them after a weight update. A fake that
drifted from the engine would make the scale benchmarks measure a runner no user runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.engine.base import GenerationEngine
from agentrl.types import SamplingParams

PROMPT = [1, 4093, 198, 1848, 314, 253, 1789, 30, 2, 198, 1, 520, 9531, 198]  # any ids the vocabulary has


@pytest.fixture(params=["local", "simulated"])
async def engine(request: pytest.FixtureRequest, tiny_model_path: Path, smollm2_tokenizer: Any
                 ) -> AsyncIterator[Any]:
    if request.param == "local":
        from agentrl.engine.local import LocalEngine

        eng: Any = LocalEngine(tiny_model_path, seed=7, batch_wait_ms=0)
    else:
        from agentrl.testing.simulated import SimulatedEngine, number_replies

        eng = SimulatedEngine(smollm2_tokenizer, number_replies(), decode_s=0.0, prefill_s=0.0)
    yield eng
    await eng.close()


def _source(engine: Any) -> Any:
    """What a trainer hands to update_weights: the local engine's own state dict (same shapes), anything for the
    simulated one."""
    return engine.model.state_dict() if hasattr(engine, "model") else {}


@pytest.mark.parametrize("max_new", [3, 40])
async def test_a_generation_is_well_formed_and_ends_as_it_says(engine: Any, max_new: int) -> None:
    assert isinstance(engine, GenerationEngine)
    assert engine.info()["engine"] == engine.name
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=3)
    gen = await engine.generate(PROMPT, sp, session_id="a")
    assert 0 < len(gen.output_ids) == len(gen.logprobs) <= max_new
    assert all(lp <= 0.0 for lp in gen.logprobs)
    assert gen.finish_reason in ("stop", "length")
    if gen.finish_reason == "stop":
        assert gen.output_ids[-1] in engine.eos_token_ids
    else:
        assert len(gen.output_ids) == max_new
    assert gen.weight_version == engine.weight_version == 0 and gen.cached_tokens == 0


async def test_prefix_reuse_follows_the_same_rule(engine: Any) -> None:
    sp = SamplingParams(temperature=1.0, max_new_tokens=5, seed=3)
    first = await engine.generate(PROMPT, sp, session_id="s")
    turn2 = PROMPT + first.output_ids + [198, 1, 4093]  # the next turn: reply + tool tokens
    second = await engine.generate(turn2, sp, session_id="s")
    # everything but the last sampled token (never fed back through the model) is reused
    assert second.cached_tokens == len(PROMPT) + len(first.output_ids) - 1
    other = await engine.generate(turn2, sp, session_id="other")  # another session never reuses this one's
    assert other.cached_tokens == 0
    third = await engine.generate(PROMPT[:6] + [777] * 8, sp, session_id="other")  # not an extension: the common part
    assert third.cached_tokens == 6


async def test_a_weight_update_tags_later_generations_and_forgets_old_keys_values(engine: Any) -> None:
    sp = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
    first = await engine.generate(PROMPT, sp, session_id="s")
    await engine.update_weights(_source(engine), 3)
    assert engine.weight_version == 3
    after = await engine.generate(PROMPT + first.output_ids + [198], sp, session_id="s")
    assert after.weight_version == 3
    assert after.cached_tokens == 0  # keys/values computed by the old weights are never reused
