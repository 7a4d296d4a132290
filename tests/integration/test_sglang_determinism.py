"""Deterministic mode over SGLang's API: the per-request seed goes out as `sampling_seed` unchanged, the stand-in
(`agentrl engine serve --deterministic`) honours it like SGLang's --enable-deterministic-inference, and a server that
does not run deterministic inference is reported with a warning."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest
import sglang_support as sup

from agentrl.engine.local import LocalEngine
from agentrl.engine.standin.sglang import StandIn, StandInServer
from agentrl.types import SamplingParams

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12)


def _prompts(n: int) -> list[list[int]]:
    rnd = random.Random(3)
    return [[rnd.randrange(3, 49_000) for _ in range(rnd.randrange(4, 40))] for _ in range(n)]


async def _serve(model: Path, *, deterministic: bool, validator: sup.RecordingValidator) -> tuple[StandInServer, LocalEngine]:
    engine = LocalEngine(model, deterministic=deterministic)
    server = StandInServer(StandIn(engine, model_path=model, validator=validator.as_validator(), worker_id="w0"))
    await server.start()
    return server, engine


async def test_seed_is_sent_unchanged_and_honoured_bit_for_bit(tiny_model_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    prompts, seeds = _prompts(6), [11, 12, 13, 14, 15, 2**61 + 5]
    reference = LocalEngine(tiny_model_path, deterministic=True)
    try:
        expected = [await reference.generate(p, SAMPLED.model_copy(update={"seed": s}), session_id="ref")
                    for p, s in zip(prompts, seeds)]
    finally:
        await reference.close()
    recorder = sup.RecordingValidator(sup.contract_validator())
    server, engine = await _serve(tiny_model_path, deterministic=True, validator=recorder)
    client = sup.sglang_engine(tiny_model_path, [server.url], deterministic=True)
    try:
        with caplog.at_level(logging.WARNING, logger="agentrl.engine.sglang"):
            await client.connect()
        got = await asyncio.gather(*(client.generate(p, SAMPLED.model_copy(update={"seed": s}), session_id=f"s{i}")
                                     for i, (p, s) in enumerate(zip(prompts, seeds))))
    finally:
        await client.close()
        await server.stop()
        await engine.close()
    assert client.info()["deterministic_inference"] is True and not caplog.records
    assert sorted(b["sampling_params"]["sampling_seed"] for b in recorder.bodies) == sorted(seeds)
    for g, e in zip(got, expected):  # concurrent requests over HTTP == one at a time in-process, to the last bit
        assert (g.output_ids, g.logprobs) == (e.output_ids, e.logprobs)


async def test_warns_when_the_server_is_not_deterministic(tiny_model_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    recorder = sup.RecordingValidator(sup.contract_validator())
    server, engine = await _serve(tiny_model_path, deterministic=False, validator=recorder)
    client = sup.sglang_engine(tiny_model_path, [server.url], deterministic=True)
    try:
        with caplog.at_level(logging.WARNING, logger="agentrl.engine.sglang"):
            await client.connect()
    finally:
        await client.close()
        await server.stop()
        await engine.close()
    assert client.info()["deterministic_inference"] is False
    assert any("--enable-deterministic-inference" in r.getMessage() and server.url in r.getMessage()
               for r in caplog.records)
