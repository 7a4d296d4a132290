"""The `vllm` engine against the vLLM a user has: 0.32 (no weight-version spans) and 0.33 (spans), and CPU servers
whose chunked prefill crashes on seeded requests. The servers here answer with the wire format each real version
was observed to use (0.32's answer has no `weight_versions` key at all; its /server_info is a VllmConfig dump);
the `vllm` tier runs the same client against a real vLLM 0.32 (tests/vllm_tier/)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentrl.engine.standin.sglang import StandInServer
from agentrl.engine.vllm import VLLMEngine
from agentrl.engine.vllm_server import facts_from, parse_version
from agentrl.errors import ConfigError, EngineError
from agentrl.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4)
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=4, seed=7)


def server_info(*, chunked: bool = True, batched: int = 2048, max_len: int = 4096, device: str = "cpu") -> dict:
    return {"vllm_config": {"model_config": {"dtype": "torch.bfloat16", "max_model_len": max_len},
                            "scheduler_config": {"enable_chunked_prefill": chunked, "max_num_batched_tokens": batched},
                            "device_config": {"device": device}, "lora_config": None}}


class FakeVLLM:
    """A vLLM `version` server: metadata, dev-mode control endpoints, and /v1/completions answers that wait for
    `release` (so a test can run a weight update while one is in flight). Spans only from 0.33 on."""

    def __init__(self, version: str, info: dict | None = None, *, spans: bool = True) -> None:
        self.version, self.info, self.spans = version, info, spans
        self.label, self.bodies, self.release = "default", [], asyncio.Event()
        self.release.set()
        app = web.Application()
        app.router.add_get("/v1/models", self._json(lambda: {"data": [{"id": "m", "root": "/m", "max_model_len": 4096}]}))
        app.router.add_get("/version", self._json(lambda: {"version": self.version}))
        app.router.add_get("/weight_info", self._json(lambda: {"weight_version": self.label}))
        app.router.add_get("/server_info", self._server_info)
        for path in ("/pause", "/resume", "/collective_rpc"):
            app.router.add_post(path, self._json(lambda: {"status": "ok"}))
        app.router.add_post("/reset_prefix_cache", self._json(lambda: {"success": True}))
        app.router.add_post("/update_weight_version", self._update_version)
        app.router.add_post("/v1/completions", self._completions)
        self._server = StandInServer(_App(app))  # type: ignore[arg-type]

    def _json(self, make: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(make())
        return handler

    async def _server_info(self, request: web.Request) -> web.Response:
        if self.info is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response(self.info)

    async def _update_version(self, request: web.Request) -> web.Response:
        self.label = (await request.json())["new_version"]
        return web.json_response({"success": True})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        await self.release.wait()
        ids = [5, 6]
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": "length", "token_ids": ids,
                                  "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * 2}}
        if self.spans and parse_version(self.version) >= (0, 33) and body.get("return_weight_versions"):
            choice["weight_versions"] = [{"version": self.label, "start": 0, "end": 2}]
        return web.json_response({"choices": [choice], "usage": {"prompt_tokens": 2, "completion_tokens": 2}})

    async def start(self) -> str:
        return await self._server.start()

    async def stop(self) -> None:
        await self._server.stop()


class _App:
    def __init__(self, app: web.Application) -> None:
        self._app = app

    def app(self) -> web.Application:
        return self._app


async def _with(fake: FakeVLLM, **kw: Any) -> tuple[VLLMEngine, str]:
    url = await fake.start()
    return VLLMEngine(urls=[url], context_window=4096, retries=2, retry_backoff_s=0.01, **kw), url


async def test_vllm_032_turns_get_the_version_of_our_own_fences(tiny_model_path: Path) -> None:
    """0.32 ignores return_weight_versions. Old client: every turn an EngineError ('returned no weight_versions'),
    so every trajectory infra_error. Now: a turn answered with no update of ours in between is tagged with the
    version we loaded; one whose answer arrives after an update began is re-run and tagged with the new one."""
    fake = FakeVLLM("0.32.0")
    eng, _ = await _with(fake)
    try:
        first = await eng.generate([1, 2], GREEDY, session_id="a")
        fake.release.clear()
        pending = asyncio.ensure_future(eng.generate([1, 2], GREEDY, session_id="b"))
        while len(fake.bodies) < 2:
            await asyncio.sleep(0.01)
        await eng.update_weights(str(tiny_model_path), 1)  # the request above is out across this update
        fake.release.set()
        straddled = await asyncio.wait_for(pending, 10)
    finally:
        await eng.close()
        await fake.stop()
    assert first.weight_version == 0 and first.output_ids == [5, 6]
    assert straddled.weight_version == 1 and straddled.finish_reason == "length"
    assert eng.stats.retried_aborted == 1 and len(fake.bodies) == 3, "the straddling answer was re-run"
    assert eng.info()["weight_version_spans"] == ["fenced"]


async def test_vllm_033_spans_stay_exact_and_are_required() -> None:
    fake = FakeVLLM("0.33.0")
    eng, _ = await _with(fake)
    try:
        fake.label = "3"
        gen = await eng.generate([1, 2], GREEDY, session_id="a")
        fake.version = "0.32.0"  # a 0.33 server (as connected) whose answer lost its spans: refused, not guessed
        with pytest.raises(EngineError, match="returned no weight_versions"):
            await eng.generate([1, 2], GREEDY, session_id="b")
    finally:
        await eng.close()
        await fake.stop()
    assert gen.weight_version == 3 and eng.info()["weight_version_spans"] == ["exact"]


async def test_deterministic_is_refused_against_a_server_that_dies_on_seeded_chunked_prefill() -> None:
    fake = FakeVLLM("0.32.0", server_info())
    eng, _ = await _with(fake, deterministic=True)
    try:
        with pytest.raises(ConfigError, match="--no-enable-chunked-prefill --max-num-batched-tokens"):
            await eng.connect()
    finally:
        await eng.close()
        await fake.stop()


async def test_no_seed_is_sent_to_such_a_server_without_deterministic_and_seeds_go_to_a_safe_one() -> None:
    risky = FakeVLLM("0.32.0", server_info())
    safe = FakeVLLM("0.32.0", server_info(chunked=False, batched=4096))
    for fake in (risky, safe):
        eng, _ = await _with(fake)
        try:
            await eng.generate([1, 2], SAMPLED, session_id="a")
        finally:
            await eng.close()
            await fake.stop()
    assert "seed" not in risky.bodies[0] and isinstance(safe.bodies[0].get("seed"), int)


def test_server_facts_from_a_real_032_dump() -> None:
    facts = facts_from("u", version={"version": "0.32.0"}, weight={"weight_version": "default"},
                       models={"data": [{"root": "/m", "max_model_len": 4096}]},
                       info=server_info(chunked=True, batched=2048))
    assert facts.spans == "fenced" and facts.seeded_prefill_crashes is True and facts.device == "cpu"
    assert facts_from("u", version={"version": "0.33.1"}).spans == "exact"
    assert facts_from("u", info=server_info(device="cuda")).seeded_prefill_crashes is False
    assert facts_from("u").seeded_prefill_crashes is None
    gaps = dict(facts.gaps(deterministic=True))
    assert any("spans" in k for k in gaps) and any("chunked prefill" in k for k in gaps)
    assert parse_version("0.33.1rc1+cpu") == (0, 33, 1) and parse_version(None) is None


def test_a_rollout_whose_every_trajectory_is_infra_error_exits_non_zero(eos_prone_model: Path, tmp_path: Path) -> None:
    """Old CLI: the real vLLM 0.32 gave every trajectory infra_error (no spans) and `agentrl rollout` exited 0. A
    server whose answers cannot be used (here: a 0.33 that lost its spans) now makes the rollout exit 3 with a
    summary; the trajectories are still stored."""
    from agentrl.store import read_trajectories

    loop = asyncio.new_event_loop()
    fake = FakeVLLM("0.33.0", spans=False)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    url = asyncio.run_coroutine_threadsafe(fake.start(), loop).result(30)
    out = tmp_path / "t.jsonl"
    try:
        r = subprocess.run([sys.executable, "-m", "agentrl.cli", "rollout", "--env", "code_tests", "--model",
                            str(eos_prone_model), "--tasks", "1", "--group-size", "2", "--max-turns", "1",
                            "--max-new-tokens", "4", "--out", str(out), "--engine", "vllm", "--engine-url", url],
                           capture_output=True, text=True, timeout=300, check=False)
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert "2/2 trajectories ended infra_error" in r.stderr
    trajs = read_trajectories(out)
    assert len(trajs) == 2 and all(t.status.value == "infra_error" for t in trajs)
