"""The simulated engine's cost model (a test utility for bench_scale): prefix cache and the shared prefill queue."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.testing.simulated import SimulatedEngine, number_replies
from agentrl.types import SamplingParams


async def _finish_times(engine: SimulatedEngine, n: int, prompt_len: int) -> list[float]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    sp = SamplingParams(temperature=1.0, max_new_tokens=64, seed=1)

    async def one(i: int) -> float:
        await engine.generate(list(range(1, prompt_len + 1)), sp, session_id=f"s{i}")
        return loop.time() - t0

    return sorted(await asyncio.gather(*(one(i) for i in range(n))))


async def test_prefills_share_one_throughput_when_set(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    alone = SimulatedEngine(tok, number_replies(), decode_s=0.0, prefill_s=0.0)
    times = await _finish_times(alone, 10, 1000)
    assert times[-1] - times[0] < 0.02  # no queue: all ten finish together
    queued = SimulatedEngine(tok, number_replies(), decode_s=0.0, prefill_tokens_per_s=100_000)
    times = await _finish_times(queued, 10, 1000)  # 10 ms of prefill each, first come first served
    # a sleep never ends early, so the k-th finish is at >= 10 ms x k however loaded the machine is
    assert all(t >= 0.01 * (k + 1) - 1e-3 for k, t in enumerate(times)), times
    assert times[-1] < 1.0


async def test_a_sessions_next_turn_prefills_only_new_tokens(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    engine = SimulatedEngine(tok, number_replies(), decode_s=0.0, prefill_tokens_per_s=1_000_000)
    sp = SamplingParams(temperature=1.0, max_new_tokens=64, seed=1)
    first = await engine.generate(list(range(1, 501)), sp, session_id="a")
    ids = list(range(1, 501)) + first.output_ids + [7, 8, 9]
    second = await engine.generate(ids, sp, session_id="a")
    # LocalEngine's rule: everything but the last sampled token, which was never fed back (test_engine_fakes_contract)
    assert first.cached_tokens == 0 and second.cached_tokens == 500 + len(first.output_ids) - 1
