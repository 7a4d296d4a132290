"""The `vllm` engine against the stand-in vLLM server (the LocalEngine behind vLLM 0.33.0's `/v1/completions` and
dev-mode control endpoints, every request judged by vLLM's own CompletionRequest/SamplingParams), plus
fault-injecting servers at the network edge (shared with the SGLang tests).

Covers: vLLM's own models rejecting wrong fields; the exact request body (names, every sampling field explicit,
request_id per attempt, session id); the SamplingParams mapping (refusals); identical ids and logprobs (1e-4) to the
local engine, single calls and multi-turn rollouts; context-window clamping; sticky routing over two servers with
prefix-cache reuse; weight updates from disk (in-flight generations aborted and re-run, later turns tagged with the
new version, a failed reload still resumes the servers); straddling generations re-run; faults (server down, 5xx,
slow answers, 4xx not retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sglang_support as sup
from aiohttp import web

from agentrl.engine.local import LocalEngine
from agentrl.engine.sglang import checkpoint_facts
from agentrl.engine.standin.sglang import StandInServer
from agentrl.engine.vllm import VLLMEngine, VLLMHTTPError, vllm_sampling
from agentrl.engine.standin.vllm_contract import (
    ENV_VAR,
    CompletionValidator,
    completion_validator,
    fetch_contract,
)
from agentrl.engine.standin.vllm import VLLMStandIn
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError, MissingDependencyError
from agentrl.runner import rollout as rollout_mod
from agentrl.types import SamplingParams, Status

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
REQUIRE_CONTRACT = os.environ.get("AGENTRL_REQUIRE_VLLM_CONTRACT") == "1"


@pytest.fixture(scope="module")
def validator() -> CompletionValidator:
    v = completion_validator()
    if not v.is_real:
        with contextlib.suppress(MissingDependencyError):
            fetch_contract()
        v = completion_validator()
    if REQUIRE_CONTRACT and not v.is_real:
        pytest.fail(f"AGENTRL_REQUIRE_VLLM_CONTRACT=1 but {v.source}")
    return v


class Recording:
    """Wraps a validator and keeps every /v1/completions body it judged."""

    def __init__(self, inner: CompletionValidator) -> None:
        self.inner, self.bodies = inner, []

    def as_validator(self) -> CompletionValidator:
        def check(body: Any, ctx: int) -> Any:
            self.bodies.append(body)
            return self.inner.check(body, ctx)

        return CompletionValidator(check, self.inner.source, self.inner.field_names)


@contextlib.asynccontextmanager
async def running(model: Path, validator: CompletionValidator, *, worker_id: str = "w0",
                  **kw: Any) -> AsyncIterator[tuple[StandInServer, LocalEngine]]:
    engine = LocalEngine(model, seed=0)
    server = StandInServer(VLLMStandIn(engine, model_path=model, validator=validator, worker_id=worker_id,
                                       **kw))  # type: ignore[arg-type]
    await server.start()
    try:
        yield server, engine
    finally:
        await server.stop()
        await engine.close()


def vllm_engine(model: Path, urls: list[str], **kw: Any) -> VLLMEngine:
    eos, window = checkpoint_facts(model)
    kw.setdefault("context_window", window)
    return VLLMEngine(urls=urls, eos_token_ids=eos, model_path=str(model), **kw)


# -- vLLM's own request models -----------------------------------------------------------------------------------

def test_contract_is_vllms_own(validator: CompletionValidator) -> None:
    if not validator.is_real:
        pytest.skip(f"vLLM's request models could not be fetched here: {validator.source}")
    assert "vllm 0.33.0 protocol" in validator.source
    assert {"max_tokens", "return_weight_versions", "return_tokens_as_token_ids", "session_id"} <= \
        validator.field_names
    ok = {"prompt": [1, 2], "max_tokens": 4, "top_k": 0, "logprobs": 0}
    assert validator.check(ok, 2048) is None
    assert not any(k == "vllm" or k.startswith("vllm.") for k in sys.modules), "stubs never leak"
    cases = [({"max_tokens": "four"}, "validation error"), ({"temperature": 3.0}, "temperature must be in [0, 2]"),
             ({"top_k": -2}, "top_k must be 0 (disable)"), ({"logprobs": -3}, "`logprobs` must be a positive"),
             ({"top_p": 0}, "top_p must be in (0, 1]"), ({"max_new_tokens": 4}, "unknown field(s) ['max_new_tokens']")]
    for bad, text in cases:
        verdict = validator.check({**ok, **bad}, 2048)
        assert verdict is not None and verdict[0] == 400 and text in verdict[1], (bad, verdict)


def test_fallback_refuses_the_same_names(validator: CompletionValidator, monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing"))
    fallback = completion_validator()
    assert not fallback.is_real and "vllm_contract fetch" in fallback.source
    assert fallback.check({"prompt": [1], "max_new_tokens": 4}, 64)[0] == 400
    assert fallback.check({"prompt": [1], "temperature": 3.0}, 64)[0] == 400
    if validator.is_real:
        assert fallback.field_names <= validator.field_names, "the fallback knows only real vLLM names"


async def test_wrong_field_is_400_and_never_reaches_the_engine(tiny_model_path: Path,
                                                              validator: CompletionValidator) -> None:
    async with running(tiny_model_path, validator) as (srv, _), aiohttp.ClientSession() as s:
        for extra in ({"max_new_tokens": 4}, {"temperature": "hot"}, {"top_k": -5}):
            async with s.post(f"{srv.url}/v1/completions", json={"prompt": [1, 2], **extra}) as r:
                assert r.status == 400
                body = await r.json()
            assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == 400
        assert not srv.standin.request_log


# -- request, response, mapping ------------------------------------------------------------------------------------

def test_sampling_mapping_is_explicit_and_refuses_silent_changes() -> None:
    mapped = vllm_sampling(SamplingParams(temperature=0.8, top_p=0.9, top_k=0))
    assert mapped == {"temperature": 0.8, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                      "presence_penalty": 0.0, "frequency_penalty": 0.0}
    with pytest.raises(ConfigError, match="raises temperatures below 0.01"):
        vllm_sampling(SamplingParams(temperature=0.005))
    with pytest.raises(ConfigError, match=r"\[0, 2\]"):
        vllm_sampling(SamplingParams(temperature=2.5))


async def test_request_body_uses_vllm_names(tiny_model_path: Path, validator: CompletionValidator) -> None:
    rec = Recording(validator)
    async with running(tiny_model_path, rec.as_validator()) as (srv, _):
        eng = vllm_engine(tiny_model_path, [srv.url])
        try:
            await eng.generate([1, 2, 3], GREEDY.model_copy(update={"stop_token_ids": [7]}), session_id="traj-1")
            await eng.generate([1, 2, 3, 4], SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=4,
                                                            seed=3), session_id="traj-1")
        finally:
            await eng.close()
    first, second = rec.bodies
    assert first == {"model": str(tiny_model_path), "prompt": [1, 2, 3], "max_tokens": 12, "temperature": 0.0,
                     "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                     "frequency_penalty": 0.0, "stop_token_ids": [7, *eng.eos_token_ids], "logprobs": 0,
                     "return_token_ids": True, "return_tokens_as_token_ids": True, "return_weight_versions": True,
                     "skip_special_tokens": False, "add_special_tokens": False, "session_id": "traj-1",
                     "request_id": first["request_id"]}
    assert second["top_k"] == 5 and isinstance(second["seed"], int) and "seed" not in first
    assert all(re.fullmatch(r"[0-9a-f]{32}", b["request_id"]) for b in rec.bodies)
    assert first["request_id"] != second["request_id"]
    assert all(validator.check(b, 2048) is None for b in rec.bodies)


async def test_greedy_generations_equal_local_engine(tiny_model_path: Path, validator: CompletionValidator) -> None:
    prompts = [[1 + i, 40 + 3 * i, 900 + i][: 1 + i % 3] * (1 + i) for i in range(6)]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=16)
    reference = LocalEngine(tiny_model_path, seed=0)
    try:
        expected = await asyncio.gather(*(reference.generate(p, sampling, session_id=f"r{i}")
                                          for i, p in enumerate(prompts)))
    finally:
        await reference.close()
    async with running(tiny_model_path, validator) as (srv, _):
        eng = vllm_engine(tiny_model_path, [srv.url])
        try:
            got = await asyncio.gather(*(eng.generate(p, sampling, session_id=f"s{i}") for i, p in enumerate(prompts)))
        finally:
            await eng.close()
    for g, e in zip(got, expected):
        assert g.output_ids == e.output_ids and g.finish_reason == e.finish_reason
        assert max(abs(a - b) for a, b in zip(g.logprobs, e.logprobs)) < 1e-4
        assert g.weight_version == 0 and g.worker == srv.url


async def test_context_window_from_models_and_clamping(tiny_model_path: Path, validator: CompletionValidator) -> None:
    rec = Recording(validator)
    async with running(tiny_model_path, rec.as_validator(), context_window=64) as (srv, _):
        eng = vllm_engine(tiny_model_path, [srv.url])  # the checkpoint says 2048; /v1/models says 64
        try:
            await eng.connect()
            assert eng.context_window == 64 and eng.info()["server_version"] == "0.33.0"
            gen = await eng.generate(list(range(1, 61)), SamplingParams(temperature=0.0, max_new_tokens=100),
                                     session_id="s")
            full = await eng.generate(list(range(1, 65)), GREEDY, session_id="s")
        finally:
            await eng.close()
    assert rec.bodies[0]["max_tokens"] == 4 and len(gen.output_ids) <= 4
    assert full.output_ids == [] and full.finish_reason == "length" and len(rec.bodies) == 1


async def test_sticky_sessions_over_two_servers_reuse_the_prefix(eos_prone_model: Path,
                                                                 validator: CompletionValidator) -> None:
    async with running(eos_prone_model, validator, worker_id="w1") as (s1, _), \
            running(eos_prone_model, validator, worker_id="w2") as (s2, _):
        eng = vllm_engine(eos_prone_model, [s1.url, s2.url])

        async def trajectory(i: int) -> list[Any]:
            context, gens = [5 + i, 6, 7, 8], []
            for _ in range(3):
                gen = await eng.generate(context, SamplingParams(temperature=0.0, max_new_tokens=16),
                                         session_id=f"traj{i}")
                gens.append(gen)
                context += gen.output_ids + [12, 13]
            return gens

        try:
            results = await asyncio.gather(*(trajectory(i) for i in range(4)))
        finally:
            await eng.close()
        log = list(s1.standin.request_log) + list(s2.standin.request_log)
    by_session: dict[str, set[str]] = {}
    for entry in log:
        by_session.setdefault(entry["session"], set()).add(entry["worker"])
    assert all(len(w) == 1 for w in by_session.values()) and {w for ws in by_session.values() for w in ws} == \
        {"w1", "w2"}
    assert all(g.cached_tokens > 0 for gens in results for g in gens[1:]), "later turns hit the prefix cache"


# -- weight updates ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["abort", "wait"])
async def test_weight_update_from_disk_reruns_or_drains(mode: str, tiny_model_path: Path, smollm2_path: Path,
                                                        tmp_path: Path, validator: CompletionValidator) -> None:
    from agentrl.testing.models import make_tiny_model

    model2 = make_tiny_model(tmp_path / "m2", tokenizer_from=smollm2_path, seed=1)
    prompts = [[3, 4, 5], [8, 9, 10, 11]]
    long = SamplingParams(temperature=0.0, max_new_tokens=200)
    async with running(tiny_model_path, validator) as (srv, _):
        eng = vllm_engine(tiny_model_path, [srv.url], retries=2, pause_mode=mode)
        try:
            tasks = [asyncio.create_task(eng.generate(p, long, session_id=f"s{i}")) for i, p in enumerate(prompts)]
            await sup.wait_until(lambda: srv.standin.in_flight == len(prompts))
            await eng.update_weights(str(model2), 1)
            gens = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            infos = await eng.weight_infos()
            after = await asyncio.wait_for(eng.generate(prompts[0], long, session_id="late"), 60)
        finally:
            await eng.close()
        log = list(srv.standin.request_log)
    assert {i["weight_version"] for i in infos.values()} == {"1"} and eng.weight_version == 1
    assert after.weight_version == 1, "turns after the update are tagged with the new version"
    reference = LocalEngine(model2, seed=0)
    try:
        expected = await reference.generate(prompts[0], long, session_id="ref")
    finally:
        await reference.close()
    assert after.output_ids == expected.output_ids, "the new weights really serve"
    if mode == "abort":
        assert all(g.weight_version == 1 for g in gens) and eng.stats.retried_aborted == len(prompts)
        assert [e["finish"] for e in log].count("abort") == len(prompts)
        assert gens[0].output_ids == expected.output_ids, "the aborted turn was re-run on the new weights"
    else:
        assert all(g.weight_version == 0 for g in gens) and eng.stats.retried_aborted == 0, "drained on the old"


async def test_a_checkpoint_that_would_not_load_is_refused_before_the_server_sees_it(
        tiny_model_path: Path, tmp_path: Path, validator: CompletionValidator) -> None:
    """Missing dir, truncated weights, other shapes: refused by agentrl, the server never paused or touched."""
    import shutil

    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model_path, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    async with running(tiny_model_path, validator) as (srv, _):
        eng = vllm_engine(tiny_model_path, [srv.url], retries=0)
        try:
            before = await eng.generate([1, 2, 3], GREEDY, session_id="s")
            with pytest.raises(EngineError, match="no-such-checkpoint: not a directory"):
                await eng.update_weights(str(tmp_path / "no-such-checkpoint"), 5)
            with pytest.raises(EngineError, match="incomplete or still-running write"):
                await eng.update_weights(str(truncated), 5)
            gen = await asyncio.wait_for(eng.generate([1, 2, 3], GREEDY, session_id="s2"), 30)
            with pytest.raises(ConfigError, match="checkpoint directory"):
                await eng.update_weights({"w": 1}, 6)
        finally:
            await eng.close()
    assert gen.output_ids == before.output_ids and gen.weight_version == 0 and eng.weight_version == 0
    assert srv.standin._paused is None


async def test_a_reload_the_server_refuses_is_not_retried_and_the_last_good_weights_come_back(
        tiny_model_path: Path, tmp_path: Path, validator: CompletionValidator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real vLLM answers a failed reload_weights with 500 and is left with meta tensors (the stand-in refuses to
    generate then). Old client: 500 counted transient, retried, EngineUnavailableError, and the broken server kept
    serving requests. Now: one attempt, the served checkpoint reloaded, an EngineError with vLLM's answer."""
    import agentrl.engine.vllm as vllm_mod

    monkeypatch.setattr(vllm_mod, "check_checkpoint", lambda *a, **k: None)  # a defect no client check can see
    async with running(tiny_model_path, validator) as (srv, _):
        eng = vllm_engine(tiny_model_path, [srv.url], retries=3, retry_backoff_s=0.01)
        calls: list[str] = []
        real_call = eng._call

        async def counting(method: str, url: str, body: Any = None, **kw: Any) -> Any:
            calls.append(url.rsplit("/", 1)[-1] + ("" if body is None else ":" + json.dumps(body)))
            return await real_call(method, url, body, **kw)

        eng._call = counting  # type: ignore[method-assign]
        try:
            before = await eng.generate([1, 2, 3], GREEDY, session_id="s")
            with pytest.raises(EngineError, match="vLLM refused to load .*no-such.*restored to") as info:
                await eng.update_weights(str(tmp_path / "no-such"), 5)
            assert not isinstance(info.value, EngineUnavailableError), "a refused load is not transient"
            assert "Worker failed with error" in str(info.value), "vLLM's own answer is in the error"
            rpc = [c for c in calls if c.startswith("collective_rpc")]
            assert len(rpc) == 2 and "no-such" in rpc[0] and str(tiny_model_path) in rpc[1], rpc
            after = await asyncio.wait_for(eng.generate([1, 2, 3], GREEDY, session_id="s2"), 30)
        finally:
            await eng.close()
    assert after.output_ids == before.output_ids and eng.weight_version == 0 and srv.standin._paused is None


async def test_when_the_restore_fails_too_the_engine_stops_generating(
        tiny_model_path: Path, tmp_path: Path, validator: CompletionValidator, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl.engine.vllm as vllm_mod

    monkeypatch.setattr(vllm_mod, "check_checkpoint", lambda *a, **k: None)
    async with running(tiny_model_path, validator) as (srv, _):
        eng = vllm_engine(tiny_model_path, [srv.url], retries=0)
        try:
            await eng.connect()
            eng.facts[srv.url].served_root = None
            eng.model_path = str(tmp_path / "gone")  # nothing good to go back to
            with pytest.raises(EngineError, match="no usable weights"):
                await eng.update_weights(str(tmp_path / "no-such"), 5)
            with pytest.raises(EngineError, match="no usable weights") as info:
                await eng.generate([1, 2, 3], GREEDY, session_id="s")
        finally:
            await eng.close()
    assert not isinstance(info.value, EngineUnavailableError)


async def test_straddling_generation_is_rerun() -> None:
    """A generation whose tokens span two weight versions is never one turn: it is re-submitted."""
    answers = [_completion([5, 6, 7], [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}]),
               _completion([5, 8], [{"version": "4", "start": 0, "end": 2}])]
    fake = ScriptedServer(answers)
    url = await fake.start()
    eng = VLLMEngine(urls=[url], context_window=2048, retries=1)
    try:
        gen = await eng.generate([1, 2], GREEDY, session_id="s")
    finally:
        await eng.close()
        await fake.stop()
    assert gen.output_ids == [5, 8] and gen.weight_version == 4 and eng.stats.retried_aborted == 1


# -- faults --------------------------------------------------------------------------------------------------------

def _completion(ids: list[int], spans: list[dict[str, Any]], finish: str = "length") -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": "", "finish_reason": finish, "token_ids": ids, "weight_versions": spans,
                         "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": len(ids)}}


class ScriptedServer:
    """Answers the metadata calls like a healthy vLLM 0.33 server; /v1/completions answers from `answers` in order,
    or misbehaves: mode "503" (overloaded), "slow" (after `delay_s`), "400" (a vLLM validation error)."""

    def __init__(self, answers: list[Any] | None = None, mode: str = "script", delay_s: float = 30.0) -> None:
        self.answers, self.mode, self.delay_s, self.hits = list(answers or []), mode, delay_s, 0
        app = web.Application()
        for path, answer in (("/v1/models", {"data": [{"id": "m", "max_model_len": 2048}]}),
                             ("/version", {"version": "0.33.0"}), ("/weight_info", {"weight_version": "default"})):
            app.router.add_get(path, _static(answer))
        app.router.add_post("/v1/completions", self._completions)
        self._server = StandInServer(_App(app))  # type: ignore[arg-type]

    async def _completions(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.mode == "503":
            return web.json_response({"error": {"message": "Service overloaded", "code": 503}}, status=503)
        if self.mode == "400":
            return web.json_response({"error": {"message": "top_k must be 0 (disable)", "code": 400}}, status=400)
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        return web.json_response(self.answers.pop(0))

    async def start(self) -> str:
        return await self._server.start()

    async def stop(self) -> None:
        await self._server.stop()


def _static(answer: dict[str, Any]) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(answer)

    return handler


class _App:
    def __init__(self, app: web.Application) -> None:
        self._app = app

    def app(self) -> web.Application:
        return self._app


async def test_server_down_is_engine_unavailable() -> None:
    url = f"http://127.0.0.1:{sup.free_port()}"
    eng = VLLMEngine(urls=[url], retries=1, retry_backoff_s=0.01)
    try:
        with pytest.raises(EngineUnavailableError, match=rf"cannot reach vLLM server {url} \(unreachable"):
            await asyncio.wait_for(eng.generate([1], GREEDY, session_id="s"), 30)
        assert await eng.health() is False
    finally:
        await eng.close()


async def test_5xx_bounded_retries_then_unavailable() -> None:
    fake = ScriptedServer(mode="503")
    eng = VLLMEngine(urls=[await fake.start()], retries=2, retry_backoff_s=0.01)
    try:
        with pytest.raises(EngineUnavailableError, match="HTTP 503: Service overloaded") as info:
            await asyncio.wait_for(eng.generate([1, 2], GREEDY, session_id="s"), 30)
    finally:
        await eng.close()
        await fake.stop()
    assert fake.hits == 3 and "failed 3 times" in str(info.value) and "vLLM" in str(info.value)


async def test_slow_answers_time_out_and_4xx_is_not_retried() -> None:
    slow = ScriptedServer(mode="slow")
    eng = VLLMEngine(urls=[await slow.start()], retries=1, retry_backoff_s=0.01, request_timeout_s=0.3)
    try:
        with pytest.raises(EngineUnavailableError, match=r"no complete answer within 0.3s"):
            await asyncio.wait_for(eng.generate([1, 2], GREEDY, session_id="s"), 10)
    finally:
        await eng.close()
        await slow.stop()
    assert slow.hits == 2
    bad = ScriptedServer(mode="400")
    eng = VLLMEngine(urls=[await bad.start()], retries=3)
    try:
        with pytest.raises(VLLMHTTPError, match="HTTP 400: top_k must be 0"):
            await eng.generate([1, 2], GREEDY, session_id="s")
    finally:
        await eng.close()
        await bad.stop()
    assert bad.hits == 1


# -- acceptance: the same multi-turn rollout through the local engine and through vLLM (stand-in) ------------------

async def test_multi_turn_rollout_identical_to_local_and_versions_tagged(
        eos_prone_model: Path, monkeypatch: pytest.MonkeyPatch, validator: CompletionValidator) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setattr(rollout_mod, "parse_tool_calls", sup.every_reply_is_a_call)
    tok = AutoTokenizer.from_pretrained(eos_prone_model)
    tasks = sup.code_tasks(2)
    local = LocalEngine(eos_prone_model, seed=0)
    try:
        expected = await sup.run_rollouts(local, tok, tasks)
    finally:
        await local.close()
    async with running(eos_prone_model, validator) as (srv, _):
        eng = vllm_engine(eos_prone_model, [srv.url])
        try:
            got = await sup.run_rollouts(eng, tok, tasks)
            await eng.update_weights(str(eos_prone_model), 1)
            later = await sup.run_rollouts(eng, tok, tasks[:1], group_size=1)
        finally:
            await eng.close()
    key = lambda t: (t.task_id, t.sample_index)  # noqa: E731
    by_key = {key(t): t for t in got}
    assert sorted(by_key) == sorted(map(key, expected))
    for e in expected:
        g = by_key[key(e)]
        assert g.status == e.status and g.prompt_ids == e.prompt_ids and g.completion_ids == e.completion_ids
        assert g.env_mask == e.env_mask and len(g.logprobs) == len(e.logprobs)
        assert max((abs(a - b) for a, b in zip(g.logprobs, e.logprobs)), default=0.0) < 1e-4
    assert all(t.meta.get("engine", {}).get("engine", "vllm") == "vllm" for t in got)
    assert any(len(t.turns) > 1 for t in got) and all(turn.weight_version == 0 for t in got for turn in t.turns)
    assert later and all(turn.weight_version == 1 for t in later for turn in t.turns)
    assert all(t.status is not Status.infra_error for t in later)


# -- the CLI and config --------------------------------------------------------------------------------------------

def test_cli_rollout_through_a_vllm_standin_process(eos_prone_model: Path, tmp_path: Path) -> None:
    import subprocess

    from agentrl.store import read_trajectories

    port = sup.free_port()
    out = tmp_path / "v.jsonl"
    cmd = [sys.executable, "-m", "agentrl.cli", "engine", "serve", "--api", "vllm", "--model", str(eos_prone_model),
           "--port", str(port), "--worker-id", "cli"]
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            sup._wait_http(f"http://127.0.0.1:{port}/v1/models", proc, open(tmp_path / "server.log", "rb"))
            r = subprocess.run([sys.executable, "-m", "agentrl.cli", "rollout", "--env", "code_tests", "--model",
                                str(eos_prone_model), "--tasks", "1", "--group-size", "2", "--max-turns", "2",
                                "--max-new-tokens", "16", "--temperature", "0", "--out", str(out), "--engine", "vllm",
                                "--engine-url", f"http://127.0.0.1:{port}"],
                               capture_output=True, text=True, timeout=300, check=False)
        finally:
            sup._stop(proc)
    assert r.returncode == 0, r.stderr[-3000:]
    trajs = read_trajectories(out)
    assert trajs and all(t.meta["engine"]["engine"] == "vllm" for t in trajs)
    assert trajs[0].meta["engine"]["workers"] == [f"http://127.0.0.1:{port}"]


def test_config_vllm_variant(tmp_path: Path) -> None:
    from agentrl.config import RolloutConfig, load_config

    cfg = load_config(RolloutConfig, None, {"engine": {"type": "vllm", "urls": ["http://a:8000"]}})
    assert cfg.engine.type == "vllm" and cfg.engine.pause_mode == "abort"
    with pytest.raises(ConfigError, match="engine.vllm.urls"):
        load_config(RolloutConfig, None, {"engine": {"type": "vllm", "urls": []}})
    with pytest.raises(ConfigError, match="router_url"):
        load_config(RolloutConfig, None, {"engine": {"type": "vllm", "urls": ["http://a"], "router_url": "http://b"}})
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"engine": {"type": "vllm", "urls": ["gpu1:8000"]}}))
    with pytest.raises(ConfigError, match="not an http"):
        load_config(RolloutConfig, path, {})
