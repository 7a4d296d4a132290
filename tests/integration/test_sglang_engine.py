"""The `sglang` engine against the stand-in SGLang server (the LocalEngine behind SGLang's native HTTP API, request
bodies judged by SGLang 0.5.23's own contract), plus fault-injecting servers at the network edge.

Covers: the exact request body (names, rid per turn, top_k=-1, stop ids), the response mapping (ids, logprobs,
finish reason, weight version, cached tokens), identical greedy results to the local engine (single calls, multi-turn
rollouts in-process and through the CLI), context-window clamping, sticky least-loaded routing, weight updates
(in-flight generations aborted and re-run, failures still continue the workers), abort handling in the runner, and
faults (503, slow answers, connection resets, a worker killed mid-generation, an unreachable server).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sglang_support as sup

from agentrl.engine.http import nodelay_socket
from agentrl.engine.local import LocalEngine
from agentrl.engine.routing import WorkerRouter
from agentrl.engine.sglang import SGLangHTTPError
from agentrl.engine.standin.sglang import StandInServer
from agentrl.errors import ConfigError, EngineError, EngineUnavailableError
from agentrl.runner import rollout as rollout_mod
from agentrl.store import read_trajectories
from agentrl.types import SamplingParams, Status

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def validator() -> Any:
    v = sup.contract_validator()
    if sup.REQUIRE_CONTRACT and not v.is_real:
        pytest.fail(f"AGENTRL_REQUIRE_SGLANG_CONTRACT=1 but {v.source}")
    return v


# -- the contract ------------------------------------------------------------------------------------------------

def test_contract_is_sglangs_own(validator: Any) -> None:
    if not validator.is_real:
        pytest.skip(f"SGLang's contract could not be fetched here: {validator.source}")
    assert "sglang 0.5.23 contract" in validator.source
    assert validator.check({"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "top_k": -1}}) is None
    error = validator.check({"input_ids": [1], "sampling_params": {"logprobs": 1}})
    assert error.startswith("unknown field `logprobs`")


def test_fallback_validator_agrees_with_the_contract(validator: Any, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    from agentrl.engine.standin.sglang_contract import ENV_VAR, generate_validator

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing.py"))
    fallback = generate_validator()
    assert not fallback.is_real and "sglang_contract fetch" in fallback.source
    if not validator.is_real:
        pytest.skip(f"nothing to compare with: {validator.source}")
    bodies = [{"input_ids": [1], "sampling_params": p} for p in (
        {"max_tokens": 4}, {"max_new_tokens": "4"}, {"temperature": "hot"}, {"no_stop_trim": 1}, {"top_k": 1.5},
        {"max_new_tokens": 3, "top_k": -1, "stop_token_ids": [2], "no_stop_trim": True, "skip_special_tokens": False},
    )]
    assert [fallback.check(b) for b in bodies] == [validator.check(b) for b in bodies]


async def test_wrong_field_is_400_with_sglangs_text(tiny_model_path: Path, validator: Any) -> None:
    async with sup.running_standin(tiny_model_path, validator=validator) as (srv, _), aiohttp.ClientSession() as s:
        cases = [({"max_tokens": 4}, "unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`"),
                 ({"top_k": "5"}, 'invalid type: string "5", expected i64'),
                 ({"no_stop_trim": 1}, "invalid type: integer `1`, expected a boolean")]
        for params, text in cases:
            async with s.post(f"{srv.url}/generate", json={"input_ids": [1, 2], "sampling_params": params}) as r:
                assert r.status == 400
                body = await r.json()
            assert set(body) == {"error"} and body["error"].startswith(text), body
        assert not srv.standin.request_log, "refused bodies never reach the engine"


# -- request and response --------------------------------------------------------------------------------------------

async def test_request_body_uses_sglang_names(tiny_model_path: Path, validator: Any) -> None:
    rec = sup.RecordingValidator(validator)
    async with sup.running_standin(tiny_model_path, validator=rec.as_validator()) as (srv, _):
        eng = sup.sglang_engine(tiny_model_path, [srv.url])
        try:
            await eng.generate([1, 2, 3], GREEDY.model_copy(update={"stop_token_ids": [7]}), session_id="traj-1")
            sampled = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=4, seed=3)
            await eng.generate([1, 2, 3, 4], sampled, session_id="traj-1")
        finally:
            await eng.close()
    first, second = rec.bodies
    assert set(first) == {"input_ids", "rid", "return_logprob", "logprob_start_len", "sampling_params"}
    assert first["input_ids"] == [1, 2, 3] and first["return_logprob"] is True
    assert first["sampling_params"] == {"max_new_tokens": 12, "temperature": 0.0, "top_p": 1.0, "top_k": -1,
                                        "stop_token_ids": [7, *eng.eos_token_ids], "no_stop_trim": True,
                                        "skip_special_tokens": False}
    assert second["sampling_params"]["top_k"] == 5 and second["sampling_params"]["top_p"] == 0.9
    assert isinstance(second["sampling_params"]["sampling_seed"], int)
    assert all(re.fullmatch(r"[0-9a-f]{32}", b["rid"]) for b in rec.bodies) and first["rid"] != second["rid"]
    assert all(validator.check(b) is None for b in rec.bodies)
    log = list(srv.standin.request_log)
    assert [e["rid"] for e in log] == [first["rid"], second["rid"]]
    assert {e["routing_key"] for e in log} == {"traj-1"}, "the routing header goes on every turn"


async def test_greedy_generations_equal_local_engine(tiny_model_path: Path) -> None:
    prompts = [[1 + i, 40 + 3 * i, 900 + i][: 1 + i % 3] * (1 + i) for i in range(8)]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=16)
    reference = LocalEngine(tiny_model_path, seed=0)
    try:
        expected = await asyncio.gather(*(reference.generate(p, sampling, session_id=f"r{i}")
                                          for i, p in enumerate(prompts)))
    finally:
        await reference.close()
    async with sup.running_standin(tiny_model_path) as (srv, _):
        eng = sup.sglang_engine(tiny_model_path, [srv.url])
        try:
            got = await asyncio.gather(*(eng.generate(p, sampling, session_id=f"s{i}") for i, p in enumerate(prompts)))
        finally:
            await eng.close()
    for g, e in zip(got, expected):
        assert g.output_ids == e.output_ids and g.finish_reason == e.finish_reason
        assert max(abs(a - b) for a, b in zip(g.logprobs, e.logprobs)) < 1e-4
        assert g.weight_version == 0 and g.worker == srv.url


async def test_cached_tokens_and_finish_reason_per_turn(eos_prone_model: Path) -> None:
    async with sup.running_standin(eos_prone_model) as (srv, _):
        eng = sup.sglang_engine(eos_prone_model, [srv.url])
        try:
            context = [1, 2, 3, 4, 5]
            turns = []
            for _ in range(3):
                gen = await eng.generate(context, SamplingParams(temperature=0.0, max_new_tokens=40), session_id="t")
                turns.append(gen)
                context = context + gen.output_ids + [10, 11]
        finally:
            await eng.close()
    assert turns[0].cached_tokens == 0 and all(t.cached_tokens > 0 for t in turns[1:])
    log = list(srv.standin.request_log)
    assert [t.cached_tokens for t in turns] == [e["cached_tokens"] for e in log]
    for t in turns:
        stopped = t.output_ids[-1] in eng.eos_token_ids
        assert t.finish_reason == ("stop" if stopped else "length")


async def test_max_new_tokens_clamped_to_context_window(tiny_model_path: Path, validator: Any) -> None:
    rec = sup.RecordingValidator(validator)
    async with sup.running_standin(tiny_model_path, validator=rec.as_validator(), context_window=64) as (srv, _):
        eng = sup.sglang_engine(tiny_model_path, [srv.url])  # the model says 2048; the server says 64
        try:
            await eng.connect()
            assert eng.context_window == 64
            gen = await eng.generate(list(range(1, 61)), SamplingParams(temperature=0.0, max_new_tokens=100),
                                     session_id="s")
            full = await eng.generate(list(range(1, 65)), GREEDY, session_id="s")
        finally:
            await eng.close()
    assert rec.bodies[0]["sampling_params"]["max_new_tokens"] == 4
    assert len(gen.output_ids) <= 4 and gen.finish_reason in ("stop", "length")
    assert full.output_ids == [] and full.finish_reason == "length" and len(rec.bodies) == 1, "no request sent"


async def test_tokenizer_path_and_checkpoint_facts_from_the_server(tiny_model_path: Path) -> None:
    from agentrl.engine.sglang import checkpoint_facts, read_tokenizer_path

    async with sup.running_standin(tiny_model_path) as (srv, local):
        served = await asyncio.to_thread(read_tokenizer_path, srv.url)
    assert Path(served) == tiny_model_path
    eos, window = checkpoint_facts(served)
    assert eos == local.eos_token_ids and window == 2048
    with pytest.raises(EngineUnavailableError, match="is the SGLang server up"):
        await asyncio.to_thread(read_tokenizer_path, f"http://127.0.0.1:{sup.free_port()}", timeout_s=2)


def test_client_pool_limits_and_nodelay() -> None:
    sock = nodelay_socket((socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", 0)))
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()

    async def check() -> None:
        eng = sup.sglang_engine(Path("."), ["http://127.0.0.1:1"], max_connections=37)
        connector = eng._transport.session().connector
        assert connector.limit == 37 and connector.limit_per_host == 37
        assert connector._socket_factory is nodelay_socket
        await eng.close()

    asyncio.run(check())


# -- routing -----------------------------------------------------------------------------------------------------

def test_router_least_loaded_then_sticky_and_lru() -> None:
    r = WorkerRouter(["http://a", "http://b"], max_sessions=3, cooldown_s=60)
    with r.track(r.pick("s1")):
        assert r.worker_of("s1") == "http://a"
        assert r.pick("s2") == "http://b", "the first turn goes to the least loaded worker"
        assert r.pick("s1") == "http://a", "later turns stay"
    assert r.pick("s3") == "http://a", "idle and one pin each: the URL order breaks the tie"
    assert r.pick("s4") == "http://b", "a has two pins now"
    assert r.sessions == 3 and r.worker_of("s2") is None, "the least recently used pin (s2; s1 was used later) went"
    r.failed("http://a", "s3")
    assert r.worker_of("s3") is None and r.pick("s3") == "http://b", "a failed worker is avoided"
    r.forget("s3")
    assert r.worker_of("s3") is None


async def test_sticky_routing_over_two_workers(eos_prone_model: Path) -> None:
    async with sup.running_standin(eos_prone_model, worker_id="w1") as (s1, _), \
            sup.running_standin(eos_prone_model, worker_id="w2") as (s2, _):
        eng = sup.sglang_engine(eos_prone_model, [s1.url, s2.url])

        async def trajectory(i: int) -> list[Any]:
            context, gens = [5 + i, 6, 7, 8], []
            for _ in range(3):
                gen = await eng.generate(context, SamplingParams(temperature=0.0, max_new_tokens=16),
                                         session_id=f"traj{i}")
                gens.append(gen)
                context += gen.output_ids + [12, 13]
            return gens

        try:
            results = await asyncio.gather(*(trajectory(i) for i in range(6)))
        finally:
            await eng.close()
        log = list(s1.standin.request_log) + list(s2.standin.request_log)
    by_key: dict[str, set[str]] = {}
    for entry in log:
        by_key.setdefault(entry["routing_key"], set()).add(entry["worker"])
    assert all(len(workers) == 1 for workers in by_key.values()), by_key
    assert {w for ws in by_key.values() for w in ws} == {"w1", "w2"}, "first turns are spread over the workers"
    assert all(g.cached_tokens > 0 for gens in results for g in gens[1:])


# -- weight updates ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["pause", "abort_all"])
async def test_weight_update_reruns_in_flight_generations(mode: str, tiny_model_path: Path, smollm2_path: Path,
                                                          tmp_path: Path) -> None:
    from agentrl.testing.models import make_tiny_model

    model2 = make_tiny_model(tmp_path / "m2", tokenizer_from=smollm2_path, seed=1)
    prompts = [[3, 4, 5], [8, 9, 10, 11]]
    long = SamplingParams(temperature=0.0, max_new_tokens=200)  # ~1 s or more: still running when the update starts
    async with sup.running_standin(tiny_model_path) as (srv, _):
        eng = sup.sglang_engine(tiny_model_path, [srv.url], retries=2, weight_update=mode)
        try:
            tasks = [asyncio.create_task(eng.generate(p, long, session_id=f"s{i}")) for i, p in enumerate(prompts)]
            await sup.wait_until(lambda: srv.standin.in_flight == len(prompts))
            await eng.update_weights(str(model2), 1)
            gens = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            infos = await eng.model_infos()
            after = await asyncio.wait_for(eng.generate([1, 2], GREEDY, session_id="late"), 30)
        finally:
            await eng.close()
        log = list(srv.standin.request_log)
    assert all(g.finish_reason != "abort" and g.weight_version == 1 for g in gens)
    aborted = [e for e in log if e["finish"] == "abort"]
    assert len(aborted) == len(prompts) and {e["weight_version"] for e in aborted} == {"default"}
    assert {e["weight_version"] for e in log if e["finish"] != "abort"} == {"1"}
    assert eng.weight_version == 1 and eng.stats.retried_aborted == len(prompts)
    assert {i["weight_version"] for i in infos.values()} == {"1"} and after.weight_version == 1
    reference = LocalEngine(model2, seed=0)
    try:
        expected = await reference.generate(prompts[0], long, session_id="ref")
    finally:
        await reference.close()
    assert gens[0].output_ids == expected.output_ids, "the re-run used the new weights"


async def test_failed_weight_update_keeps_serving(tiny_model_path: Path, tmp_path: Path) -> None:
    async with sup.running_standin(tiny_model_path) as (srv, _):
        eng = sup.sglang_engine(tiny_model_path, [srv.url], retries=0)
        try:
            with pytest.raises(EngineError, match="Failed to update weights") as info:
                await eng.update_weights(str(tmp_path / "no-such-checkpoint"), 5)
            assert "no-such-checkpoint" in str(info.value)
            gen = await asyncio.wait_for(eng.generate([1, 2, 3], GREEDY, session_id="s"), 30)
            with pytest.raises(ConfigError, match="checkpoint directory"):
                await eng.update_weights({"w": 1}, 6)
        finally:
            await eng.close()
    assert gen.weight_version == 0 and eng.weight_version == 0, "the server was continued, old weights kept"


async def test_aborted_turns_are_never_stored(eos_prone_model: Path) -> None:
    """Every generation is aborted (retries=0): the runner never stores the partial turn; the trajectory is an
    infra_error, retried within its budget, never scored."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(eos_prone_model)
    async with sup.running_standin(eos_prone_model) as (srv, local):
        srv.standin.engine = sup.NeverFinishes(local)  # every generation runs until it is aborted
        eng = sup.sglang_engine(eos_prone_model, [srv.url], retries=0)

        async def abort_everything() -> None:
            while True:
                if srv.standin.in_flight:
                    srv.standin._abort("", abort_all=True, message="Abort by test")
                await asyncio.sleep(0.005)

        aborter = asyncio.create_task(abort_everything())
        try:
            trajs = await asyncio.wait_for(sup.run_rollouts(eng, tok, sup.code_tasks(1), group_size=1,
                                                            infra_retries=1), 120)
        finally:
            aborter.cancel()
            await eng.close()
        log = list(srv.standin.request_log)
    (traj,) = trajs
    assert traj.status is Status.infra_error and traj.attempt == 1 and traj.reward is None
    assert traj.turns == [] and traj.completion_ids == [] and "aborted" in (traj.error or "")
    assert [e["finish"] for e in log] == ["abort", "abort"]


# -- faults --------------------------------------------------------------------------------------------------------

async def _fault_engine(mode: str, **kw: Any) -> tuple[Any, sup.FaultStandIn, StandInServer]:
    fault = sup.FaultStandIn(mode, delay_s=kw.pop("delay_s", 30.0))
    server = StandInServer(fault)
    url = await server.start()
    return sup.sglang_engine(Path("."), [url], context_window=2048, **kw), fault, server


async def test_503_bounded_retries_then_unavailable() -> None:
    eng, fault, server = await _fault_engine("503", retries=2, retry_backoff_s=0.01)
    try:
        with pytest.raises(EngineUnavailableError, match="HTTP 503: Service overloaded") as info:
            await asyncio.wait_for(eng.generate([1, 2], GREEDY, session_id="s"), 30)
    finally:
        await eng.close()
        await server.stop()
    assert fault.generate_hits == 3 and "failed 3 times" in str(info.value)


async def test_4xx_is_not_retried_and_shows_sglangs_message(tiny_model_path: Path) -> None:
    eng, fault, server = await _fault_engine("400", retries=3)
    try:
        with pytest.raises(SGLangHTTPError, match="HTTP 400: unknown field `max_tokens`"):
            await eng.generate([1, 2], GREEDY, session_id="s")
    finally:
        await eng.close()
        await server.stop()
    assert fault.generate_hits == 1
    async with sup.running_standin(tiny_model_path) as (srv, _):  # a server-side error of the real stand-in
        eng = sup.sglang_engine(tiny_model_path, [srv.url], retries=3)
        try:
            with pytest.raises(SGLangHTTPError, match="token id out of range"):
                await eng.generate([10**7], GREEDY, session_id="s")
        finally:
            await eng.close()


async def test_slow_answers_time_out_with_bounded_retries() -> None:
    eng, fault, server = await _fault_engine("slow", retries=1, retry_backoff_s=0.01, request_timeout_s=0.3)
    try:
        with pytest.raises(EngineUnavailableError, match=r"no complete answer within 0.3s"):
            await asyncio.wait_for(eng.generate([1, 2], GREEDY, session_id="s"), 10)
    finally:
        await eng.close()
        await server.stop()
    assert fault.generate_hits == 2


async def test_connection_reset_bounded_retries() -> None:
    reset = sup.ResetServer()
    url = await reset.start()
    eng = sup.sglang_engine(Path("."), [url], context_window=2048, retries=2, retry_backoff_s=0.01)
    try:
        with pytest.raises(EngineUnavailableError, match="connection failed"):
            await asyncio.wait_for(eng.generate([1, 2], GREEDY, session_id="s"), 30)
    finally:
        await eng.close()
        await reset.stop()
    assert reset.resets == 3


async def test_unreachable_server_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{sup.free_port()}"
    eng = sup.sglang_engine(Path("."), [url], retries=1, retry_backoff_s=0.01)
    try:
        with pytest.raises(EngineUnavailableError, match=rf"cannot reach SGLang worker {url} \(unreachable"):
            await asyncio.wait_for(eng.generate([1], GREEDY, session_id="s"), 30)
        assert await eng.health() is False
    finally:
        await eng.close()


async def test_worker_killed_mid_generation(tiny_model_path: Path) -> None:
    """kill -9 of a worker while it generates: with a second worker the turn is re-run there; alone, bounded
    retries end in EngineUnavailableError. Nothing hangs."""
    port = sup.free_port()
    doomed = f"http://127.0.0.1:{port}"
    long = SamplingParams(temperature=0.0, max_new_tokens=1500)
    with sup.standin_process(tiny_model_path, port, "doomed") as proc:
        async with sup.running_standin(tiny_model_path, worker_id="survivor") as (srv, _):
            pair = sup.sglang_engine(tiny_model_path, [doomed, srv.url], retries=2, retry_backoff_s=0.05)
            alone = sup.sglang_engine(tiny_model_path, [doomed], retries=2, retry_backoff_s=0.05)
            try:
                await asyncio.gather(pair.connect(), alone.connect())
                moved = asyncio.create_task(pair.generate([1, 2, 3], long, session_id="t1"))
                stuck = asyncio.create_task(alone.generate([1, 2, 3], long, session_id="t2"))
                await sup.wait_until(lambda: pair.in_flight[doomed] == 1 and alone.in_flight[doomed] == 1)
                await asyncio.sleep(0.2)
                os.killpg(proc.pid, signal.SIGKILL)
                gen = await asyncio.wait_for(moved, 120)
                with pytest.raises(EngineUnavailableError, match="failed 3 times"):
                    await asyncio.wait_for(stuck, 60)
            finally:
                await pair.close()
                await alone.close()
    assert gen.worker == srv.url and gen.finish_reason in ("stop", "length") and len(gen.output_ids) > 0
    assert pair.worker_of("t1") == srv.url and pair.stats.retried_transient >= 1


# -- acceptance: the same rollout through the local engine and through SGLang (stand-in) ----------------------------

async def test_multi_turn_rollout_identical_to_local(eos_prone_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setattr(rollout_mod, "parse_tool_calls", sup.every_reply_is_a_call)
    tok = AutoTokenizer.from_pretrained(eos_prone_model)
    tasks = sup.code_tasks(2)
    local = LocalEngine(eos_prone_model, seed=0)
    try:
        expected = await sup.run_rollouts(local, tok, tasks)
    finally:
        await local.close()
    async with sup.running_standin(eos_prone_model) as (srv, _):
        eng = sup.sglang_engine(eos_prone_model, [srv.url])
        try:
            got = await sup.run_rollouts(eng, tok, tasks)
        finally:
            await eng.close()
    _assert_same_trajectories(expected, got)
    multi = [t for t in got if len(t.turns) > 1]
    assert multi and all(turn.cached_tokens > 0 for t in multi for turn in t.turns[1:])
    assert all("42" in turn.observation for t in multi for turn in t.turns if turn.env_len), "tools really ran"


async def test_weight_update_mid_run_tags_every_turn(eos_prone_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setattr(rollout_mod, "parse_tool_calls", sup.every_reply_is_a_call)
    tok = AutoTokenizer.from_pretrained(eos_prone_model)
    async with sup.running_standin(eos_prone_model) as (srv, _):
        eng = sup.sglang_engine(eos_prone_model, [srv.url], retries=3)

        async def update_when_half_done() -> None:
            await sup.wait_until(lambda: sum(e["finish"] != "abort" for e in srv.standin.request_log) >= 5, 120)
            await eng.update_weights(str(eos_prone_model), 1)

        updater = asyncio.create_task(update_when_half_done())
        try:
            trajs = await sup.run_rollouts(eng, tok, sup.code_tasks(3), max_turns=4, max_trajectories=6)
            await asyncio.wait_for(updater, 60)
        finally:
            updater.cancel()
            await eng.close()
        log = list(srv.standin.request_log)
    assert all(t.status is not Status.infra_error for t in trajs), [t.error for t in trajs]
    versions = [turn.weight_version for t in trajs for turn in t.turns]
    assert set(versions) == {0, 1}
    for t in trajs:
        assert all(turn.finish_reason != "abort" for turn in t.turns)
        tv = [turn.weight_version for turn in t.turns]
        assert tv == sorted(tv)
        served = [e for e in log if e["routing_key"] == t.id and e["finish"] != "abort"]
        assert [(str(turn.weight_version) if turn.weight_version else "default", turn.model_len) for turn in t.turns] \
            == [(e["weight_version"], e["completion_tokens"]) for e in served], "a turn = the generation that made it"


def _assert_same_trajectories(expected: list[Any], got: list[Any]) -> None:
    key = lambda t: (t.task_id, t.sample_index)
    assert sorted(map(key, expected)) == sorted(map(key, got))
    by_key = {key(t): t for t in got}
    for e in expected:
        g = by_key[key(e)]
        assert g.status == e.status and g.prompt_ids == e.prompt_ids
        assert g.completion_ids == e.completion_ids and g.env_mask == e.env_mask
        assert len(g.logprobs) == len(e.logprobs)
        assert max((abs(a - b) for a, b in zip(g.logprobs, e.logprobs)), default=0.0) < 1e-4
        assert [t.model_len for t in g.turns] == [t.model_len for t in e.turns]


# -- the CLI ---------------------------------------------------------------------------------------------------------

def _rollout_cmd(model: Path, out: Path, *engine_args: str) -> list[str]:
    return [sys.executable, "-m", "agentrl.cli", "rollout", "--env", "code_tests", "--model", str(model), "--tasks",
            "2", "--group-size", "2", "--max-turns", "2", "--max-new-tokens", "24", "--temperature", "0",
            "--seed", "3", "--out", str(out), *engine_args]


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def test_cli_rollout_local_and_sglang_identical(eos_prone_model: Path, tmp_path: Path) -> None:
    local_out, sglang_out = tmp_path / "local.jsonl", tmp_path / "sglang.jsonl"
    r = _run(_rollout_cmd(eos_prone_model, local_out, "--engine", "local"), 300)
    assert r.returncode == 0, r.stderr[-3000:]
    port = sup.free_port()
    with sup.standin_process(eos_prone_model, port, "cli"):
        r = _run(_rollout_cmd(eos_prone_model, sglang_out, "--engine", "sglang", "--engine-url",
                              f"http://127.0.0.1:{port}"), 300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = read_trajectories(sglang_out)
    assert all(t.meta["engine"]["engine"] == "sglang" for t in got)
    assert got[0].meta["engine"]["workers"] == [f"http://127.0.0.1:{port}"]
    _assert_same_trajectories(read_trajectories(local_out), got)


def test_cli_unreachable_engine_fails_fast(eos_prone_model: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{sup.free_port()}"
    r = _run(_rollout_cmd(eos_prone_model, tmp_path / "t.jsonl", "--engine-url", url), 120)
    assert r.returncode == 2 and f"cannot reach SGLang worker {url}" in r.stderr, r.stderr[-2000:]


def test_config_requires_a_target(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps({"engine": {"type": "sglang", "max_connections": 8}}))
    r = _run([sys.executable, "-m", "agentrl.cli", "rollout", "--config", str(cfg)], 60)
    assert r.returncode == 2 and "engine.sglang" in r.stderr and "router_url" in r.stderr, r.stderr[-2000:]
