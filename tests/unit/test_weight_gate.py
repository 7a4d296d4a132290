"""agentrl.engine.weight_gate.WeightGate: generate calls wait while an update runs; one update at a time; a failed
update still opens the gate. And both HTTP clients are faces of the one HTTPEngine base."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.engine.weight_gate import WeightGate


async def test_waiters_are_held_until_the_update_ends_and_updates_run_one_at_a_time() -> None:
    gate, order = WeightGate(), []
    await asyncio.wait_for(gate.wait(), 1)  # open before any update

    async def update(name: str, hold: asyncio.Event) -> None:
        async with gate.closed():
            order.append(f"{name} start")
            await hold.wait()
            order.append(f"{name} end")

    first, second = asyncio.Event(), asyncio.Event()
    u1 = asyncio.create_task(update("u1", first))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(gate.wait())
    u2 = asyncio.create_task(update("u2", second))
    await asyncio.sleep(0.01)
    assert not waiter.done() and order == ["u1 start"], "the second update waits for the first"
    first.set()
    await asyncio.sleep(0.01)
    assert order == ["u1 start", "u1 end", "u2 start"]
    second.set()
    await asyncio.wait_for(asyncio.gather(u1, u2, waiter), 1)


async def test_a_failed_update_opens_the_gate() -> None:
    gate = WeightGate()
    with pytest.raises(RuntimeError):
        async with gate.closed():
            raise RuntimeError("load failed")
    await asyncio.wait_for(gate.wait(), 1)


def test_both_http_clients_are_faces_of_one_base() -> None:
    from agentrl.engine.http_engine import HTTPEngine
    from agentrl.engine.sglang import SGLangEngine
    from agentrl.engine.vllm import VLLMEngine

    for cls in (SGLangEngine, VLLMEngine):
        assert issubclass(cls, HTTPEngine)
        for shared in ("generate", "connect", "update_weights", "_on_workers", "_call", "health"):
            assert shared not in vars(cls), f"{cls.__name__} re-implements {shared}"
