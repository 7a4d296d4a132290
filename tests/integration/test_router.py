"""The `sglang` engine through the real sglang-router 0.3.2 binary (`--policy manual`) with two stand-in workers.

Asserted from the stand-ins' own request logs: every turn of a trajectory lands on the same worker (the engine sends
`X-SMG-Routing-Key: <trajectory id>` on every turn) and its later turns reuse cached tokens; control calls, which the
router does not proxy, reach every worker (learned from the router's GET /workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sglang_support as sup

from agentrl.runner import rollout as rollout_mod
from agentrl.types import SamplingParams, Status

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None,
                                reason="sglang-router is not installed (pip install sglang-router==0.3.2)")


@contextlib.asynccontextmanager
async def router(workers: list[str]) -> AsyncIterator[str]:
    port = sup.free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *workers, "--policy", "manual", "--worker-startup-check-interval", "1",
           "--log-level", "warn"]
    log = tempfile.TemporaryFile()  # noqa: SIM115 - a file, not a pipe nobody drains
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_for_workers(url, len(workers), proc, log)
        yield url
    finally:
        log.close()
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _wait_for_workers(url: str, n: int, proc: Any, log: Any, timeout: float = 60.0) -> None:
    async with aiohttp.ClientSession() as s, asyncio.timeout(timeout):
        while True:
            if proc.returncode is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise RuntimeError(f"sglang-router exited with {proc.returncode}: {err[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(f"{url}/workers") as r:
                    if r.status == 200:
                        workers = (await r.json()).get("workers", [])
                        if len(workers) == n and all(w.get("is_healthy") for w in workers):
                            return
            await asyncio.sleep(0.2)


async def test_turns_stick_to_one_worker_and_reuse_its_cache(eos_prone_model: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setattr(rollout_mod, "parse_tool_calls", sup.every_reply_is_a_call)
    tok = AutoTokenizer.from_pretrained(eos_prone_model)
    async with sup.running_standin(eos_prone_model, worker_id="w1") as (s1, _), \
            sup.running_standin(eos_prone_model, worker_id="w2") as (s2, _), router([s1.url, s2.url]) as url:
        eng = sup.sglang_engine(eos_prone_model, router_url=url)
        try:
            trajs = await sup.run_rollouts(eng, tok, sup.code_tasks(3), group_size=2, max_turns=3,
                                           max_trajectories=6)
        finally:
            await eng.close()
        log = list(s1.standin.request_log) + list(s2.standin.request_log)
    assert all(t.status is not Status.infra_error for t in trajs), [t.error for t in trajs]
    for t in trajs:
        served = [e for e in log if e["routing_key"] == t.id]
        assert len(served) == len(t.turns) and len({e["worker"] for e in served}) == 1, served
        assert [turn.cached_tokens for turn in t.turns] == [e["cached_tokens"] for e in served]
        assert all(turn.cached_tokens > 0 for turn in t.turns[1:])
    assert sum(len(t.turns) > 1 for t in trajs) >= 2, [len(t.turns) for t in trajs]


async def test_control_calls_reach_every_worker(tiny_model_path: Path) -> None:
    """One worker is its own process (as in production): two checkpoint loads at once in one process race inside
    transformers (meta tensors), which real SGLang workers never share."""
    port = sup.free_port()
    w2 = f"http://127.0.0.1:{port}"
    with sup.standin_process(tiny_model_path, port, "w2"):
        async with sup.running_standin(tiny_model_path, worker_id="w1") as (s1, _), router([s1.url, w2]) as url:
            await _control_calls(tiny_model_path, url, [s1.url, w2])


async def _control_calls(model: Path, url: str, workers: list[str]) -> None:
    eng = sup.sglang_engine(model, router_url=url, retries=1)
    try:
        await eng.connect()
        assert sorted(eng.workers) == sorted(workers), "workers learned from GET /workers"
        async with aiohttp.ClientSession() as s, s.post(f"{url}/update_weights_from_disk",
                                                        json={"model_path": str(model)}) as r:
            assert r.status == 404, "the router does not proxy weight updates"
        await eng.update_weights(str(model), 3)
        infos = await eng.model_infos()
        gen = await eng.generate([1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=4), session_id="k")
        assert await eng.health()
    finally:
        await eng.close()
    assert {i["weight_version"] for i in infos.values()} == {"3"} and len(infos) == 2
    assert gen.weight_version == 3 and gen.worker is None
