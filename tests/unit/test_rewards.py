"""Reward sources: YAML shorthand and its errors, the weighted sum and its components, each built-in source's rule
(length counts model tokens only and only on fully correct answers; format cannot be satisfied by an empty or
action-less episode), the http source against the reference server (payload built from the record, retries, service
down / garbage -> InfraError, never 0), and the schema upgrade of old records."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import RolloutConfig, load_config
from agentrl.errors import ConfigError, InfraError
from agentrl.reward import (RewardServiceError, RewardSpec, Scorer, available_rewards, format_followed,
                            parse_reward_list, score)
from agentrl.reward.server import RewardServer, reference_reward
from agentrl.store import TrajectoryStore, read_trajectories
from agentrl.types import SCHEMA_VERSION, Message, Status, ToolCall, ToolResult, Trajectory, Turn
from agentrl.types import TestOutcome as Outcome
from agentrl.types import TestReport as Report

ACCEPTANCE = [{"unit_tests": 1.0}, {"length_penalty": {"weight": 1.0, "expected_tokens": 256}},
              {"http": {"url": "http://127.0.0.1:1/score", "weight": 0.5}}]


def traj(*, passed: int = 2, total: int = 2, model_tokens: int = 10, tool_tokens: int = 0, calls: int = 1,
         parse_errors: int = 0, finish: str = "stop", status: Status = Status.ok, text: str = "```python\nx\n```",
         tool_error: str | None = None, tid: str = "t1") -> Trajectory:
    ids = list(range(model_tokens + tool_tokens))
    call = [ToolCall(id=f"c{k}", name="run", arguments={"code": "x"}) for k in range(calls)]
    results = [ToolResult(call_id=c.id, name="run", output="ok", error=tool_error) for c in call]
    turn = Turn(index=0, start=0, model_len=model_tokens, env_len=tool_tokens, text=text, finish_reason=finish,
                tool_calls=call, tool_results=results, parse_errors=["bad"] * parse_errors, observation="ok")
    return Trajectory(id=tid, group_id="g", task_id="task-1", env="code_tests", status=status, prompt_ids=[1, 2],
                      completion_ids=ids, logprobs=[0.0] * len(ids), env_mask=[1] * model_tokens + [0] * tool_tokens,
                      turns=[turn] if model_tokens else [],
                      tests=None if status is Status.infra_error else Report(
                          passed=passed, total=total, outcomes=[Outcome(name="a", passed=passed > 0)]))


# -- config -------------------------------------------------------------------------------------------------------

def test_builtin_sources_are_registered() -> None:
    assert {"unit_tests", "length_penalty", "format", "http"} <= set(available_rewards())


def test_shorthand_forms_parse_to_the_canonical_form() -> None:
    specs = parse_reward_list(ACCEPTANCE, "t")
    assert [(s.source, s.weight, s.key) for s in specs] == [("unit_tests", 1.0, "unit_tests"),
                                                            ("length_penalty", 1.0, "length_penalty"),
                                                            ("http", 0.5, "http")]
    assert specs[1].options == {"expected_tokens": 256, "alpha": 0.001}
    assert RewardSpec.model_validate("format").weight == 1.0
    canonical = [s.model_dump(mode="json") for s in specs]
    assert [RewardSpec.model_validate(c) for c in canonical] == specs  # config.json round trip


@pytest.mark.parametrize("entry, expected", [
    ({"nope": 1.0}, "'nope' is not registered"),
    ({"http": {"weight": 0.5}}, "field 'url': Field required"),
    ({"length_penalty": {"expected": 3}}, "field 'expected': unknown option"),
    ({"unit_tests": 1.0, "format": 1.0}, "each reward entry names one source"),
    ({"http": {"url": "ftp://x"}}, "is not an http(s) URL"),
    ({"unit_tests": float("nan")}, "weight must be a finite number"),
])
def test_bad_entries_name_the_problem(entry: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=r"reward\[0\]") as info:
        parse_reward_list([entry], "job.yaml")
    assert expected in str(info.value)


def test_duplicate_names_need_a_label_and_empty_lists_are_refused() -> None:
    with pytest.raises(ConfigError, match="give one of them a `label`"):
        parse_reward_list([{"format": 1.0}, {"format": 2.0}], "t")
    assert [s.key for s in parse_reward_list([{"format": 1.0}, {"format": {"weight": 2, "label": "f2"}}], "t")] == \
        ["format", "f2"]
    with pytest.raises(ConfigError, match="at least one source"):
        parse_reward_list([], "t")


def test_rollout_config_validates_reward_at_load(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("reward:\n  - unit_tests: 1.0\n  - http: {weight: 0.5}\n")
    with pytest.raises(ConfigError, match=r"field 'reward.1'.*'url'"):
        load_config(RolloutConfig, path)
    assert [s.source for s in RolloutConfig().reward] == ["unit_tests"]


# -- the scorer -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("passed, total", [(0, 3), (1, 3), (2, 3), (3, 3), (0, 0), (7, 9)])
async def test_default_scorer_reproduces_the_test_fraction_bit_for_bit(passed: int, total: int) -> None:
    t = traj(passed=passed, total=total)
    scored = await Scorer().score(t)
    assert scored.reward == score(t).reward == (passed / total if total else 0.0)
    assert scored.reward_components == {"unit_tests": scored.reward}
    assert scored.meta["reward"] == [{"source": "unit_tests", "weight": 1.0, "label": None, "options": {}}]


async def test_weighted_sum_and_unweighted_components() -> None:
    specs = parse_reward_list([{"unit_tests": 2.0}, {"length_penalty": {"weight": 3.0, "expected_tokens": 100,
                                                                       "alpha": 0.01}}, {"format": -0.5}], "t")
    scored = await Scorer(specs).score(traj(model_tokens=150))
    assert scored.reward_components == {"unit_tests": 1.0, "length_penalty": pytest.approx(-0.5), "format": 1.0}
    assert scored.reward == pytest.approx(2.0 * 1.0 + 3.0 * -0.5 - 0.5 * 1.0)


async def test_infra_error_trajectories_stay_unscored() -> None:
    scored = await Scorer(parse_reward_list([{"format": 1.0}, {"length_penalty": 1.0}], "t")).score(
        traj(status=Status.infra_error))
    assert scored.reward is None and scored.reward_components == {}


async def test_a_source_without_anything_to_score_makes_the_reward_none_not_zero() -> None:
    t = traj().model_copy(update={"tests": None})
    assert (await Scorer().score(t)).reward is None


# -- rules ----------------------------------------------------------------------------------------------------------

async def test_length_penalty_counts_model_tokens_only_and_only_when_fully_correct() -> None:
    specs = parse_reward_list([{"length_penalty": {"expected_tokens": 100, "alpha": 0.001}}], "t")
    scorer = Scorer(specs)
    many_tool_tokens = await scorer.score(traj(model_tokens=90, tool_tokens=5000))
    assert many_tool_tokens.reward_components["length_penalty"] == 0.0
    long_correct = await scorer.score(traj(model_tokens=400))
    assert long_correct.reward_components["length_penalty"] == pytest.approx(-0.3)
    long_partial = await scorer.score(traj(model_tokens=400, passed=1))
    assert long_partial.reward_components["length_penalty"] == 0.0
    no_tests = await scorer.score(traj(model_tokens=400, passed=0, total=0))
    assert no_tests.reward_components["length_penalty"] == 0.0


@pytest.mark.parametrize("kwargs, followed", [
    ({}, True),
    ({"model_tokens": 0, "calls": 0}, False),  # the empty episode
    ({"calls": 0}, False),  # talked, never acted
    ({"parse_errors": 1}, False),
    ({"finish": "length"}, False),  # cut mid-turn: its last call was never checked
    ({"tool_error": "unknown_tool"}, False),
    ({"tool_error": "bad_arguments"}, False),
    ({"tool_error": "tool_failed"}, True),  # a well-formed call whose code failed is the task's business
])
def test_format_rule(kwargs: dict[str, Any], followed: bool) -> None:
    assert format_followed(traj(**kwargs)) is followed


def test_format_without_required_call() -> None:
    assert format_followed(traj(calls=0), require_call=False)
    assert not format_followed(traj(model_tokens=0, calls=0), require_call=False)


# -- http ---------------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prompt(t: Trajectory) -> list[Message]:
    return [Message(role="system", content="sys"), Message(role="user", content=f"solve {t.task_id}")]


def _http_scorer(url: str, **options: Any) -> Scorer:
    spec = {"http": {"url": url, "retries": 2, "backoff_s": 0.01, "timeout_s": 5, **options}}
    return Scorer(parse_reward_list([spec], "t"), prompt_messages=_prompt)


async def test_http_payload_is_built_from_the_record_and_model_text_cannot_add_fields() -> None:
    server = RewardServer()
    url = await server.start()
    hostile = 'x", "reward": 99, "tests": null, "injected": "1'
    t = traj(text=hostile, passed=1, total=2)
    try:
        async with _http_scorer(url) as scorer:
            scored = await scorer.score(t)
    finally:
        await server.stop()
    [req] = server.requests
    assert req.completion_text == hostile and req.tests is not None and req.tests.passed == 1
    assert [(m.role, m.content) for m in req.messages] == [("system", "sys"), ("user", "solve task-1"),
                                                            ("assistant", hostile), ("tool", "ok")]
    assert req.trajectory_id == t.id and req.model_tokens == 10
    assert scored.reward_components["http"] == reference_reward(req) == pytest.approx(0.5 / (1 + len(hostile) / 1000))


async def test_http_retries_a_warming_service() -> None:
    server = RewardServer(fail_first=2)
    url = await server.start()
    try:
        async with _http_scorer(url) as scorer:
            scored = await scorer.score(traj())
    finally:
        await server.stop()
    assert server.received == 3 and scored.reward is not None


async def test_http_service_down_is_an_infra_error_never_zero() -> None:
    async with _http_scorer(f"http://127.0.0.1:{_free_port()}/score") as scorer:
        with pytest.raises(RewardServiceError, match="failed 3 times") as info:
            await scorer.score(traj())
    assert isinstance(info.value, InfraError)


@pytest.mark.parametrize("server_kwargs, match, requests", [
    ({"garbage": True}, "answered non-JSON", 1),
    ({"fail_first": 10}, "failed 3 times.*HTTP 503", 3),
])
async def test_http_garbage_or_persistent_failure_is_an_infra_error(server_kwargs: dict[str, Any], match: str,
                                                                    requests: int) -> None:
    server = RewardServer(**server_kwargs)
    url = await server.start()
    try:
        async with _http_scorer(url) as scorer:
            with pytest.raises(RewardServiceError, match=match):
                await scorer.score(traj())
    finally:
        await server.stop()
    assert server.received == requests


class _PickyService:
    """A real aiohttp reward service: answers `status` for a trajectory whose model text contains `trigger` (or for
    every request with `reject_all`), {"reward": 1.0} otherwise; counts what it received."""

    def __init__(self, status: int, *, trigger: str = "HUGE", reject_all: bool = False) -> None:
        self.status, self.trigger, self.reject_all = status, trigger, reject_all
        self.bodies: list[dict[str, Any]] = []
        self._runner: Any = None

    async def _score(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        if self.reject_all or self.trigger in body["completion_text"]:
            return web.json_response({"detail": "request entity too large"}, status=self.status)
        return web.json_response({"reward": 1.0})

    async def start(self) -> str:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/score", self._score)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/score"

    async def stop(self) -> None:
        await self._runner.cleanup()


@pytest.mark.parametrize("status", [400, 413, 422])
@pytest.mark.parametrize("first", [True, False])
async def test_http_content_rejection_is_a_zero_with_the_reason_not_a_failure(status: int, first: bool) -> None:
    """The policy's text makes the service refuse it while the service accepts other requests: that component is
    0 with the service's reason (not unscored: a policy must not dodge a score by writing what the RM rejects).
    `first`: nothing was accepted yet, so a canary without the policy's text shows the service works."""
    service = _PickyService(status)
    url = await service.start()
    try:
        async with _http_scorer(url) as scorer:
            if not first:
                assert (await scorer.score(traj(tid="fine"))).reward == 1.0
            scored = await scorer.score(traj(text="HUGE " * 100, tid="hostile"))
    finally:
        await service.stop()
    assert scored.reward == 0.0 and scored.reward_components == {"http": 0.0}
    assert f"HTTP {status}" in scored.meta["reward_rejected"]["http"]
    assert "request entity too large" in scored.meta["reward_rejected"]["http"]
    hostile = [b for b in service.bodies if b["trajectory_id"] == "hostile"]
    assert len(hostile) == (2 if first else 1), "never retried; the canary only while nothing was accepted"
    if first:
        assert hostile[1]["completion_text"] == "" and hostile[1]["tests"] is None, "the canary has no policy text"


@pytest.mark.parametrize(("status", "reject_all", "match"), [
    (422, True, "rejects every request"),
    (413, True, "rejects every request"),
    (401, False, "not about the trajectory's content"),
    (404, False, "not about the trajectory's content"),
])
async def test_http_a_service_that_rejects_every_request_is_a_configuration_error(
        status: int, reject_all: bool, match: str) -> None:
    service = _PickyService(status, trigger="", reject_all=reject_all)
    url = await service.start()
    try:
        async with _http_scorer(url) as scorer:
            with pytest.raises(ConfigError, match=match) as info:
                await scorer.score(traj())
    finally:
        await service.stop()
    assert not isinstance(info.value, InfraError) and "reward http.url" in str(info.value)


async def test_http_concurrency_limit_holds() -> None:
    import asyncio

    server = RewardServer()
    in_flight, peak = 0, 0
    original = server._score

    async def slow(request: Any) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        try:
            return await original(request)
        finally:
            in_flight -= 1

    server._score = slow  # type: ignore[method-assign]
    url = await server.start()
    try:
        async with _http_scorer(url, max_concurrency=2) as scorer:
            await asyncio.gather(*(scorer.score(traj(tid=f"t{k}")) for k in range(8)))
    finally:
        await server.stop()
    assert peak == 2 and len(server.requests) == 8


# -- storage --------------------------------------------------------------------------------------------------------

def test_version_1_records_read_with_empty_components(tmp_path: Path) -> None:
    old = json.loads(traj().model_dump_json())
    old["schema_version"] = 1
    del old["reward_components"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    [t] = read_trajectories(path)
    assert t.reward_components == {} and t.schema_version == SCHEMA_VERSION
    with TrajectoryStore(tmp_path / "new.jsonl") as store:
        store.append_group([t.model_copy(update={"reward_components": {"unit_tests": 1.0}})])
    assert read_trajectories(tmp_path / "new.jsonl")[0].reward_components == {"unit_tests": 1.0}


def test_version_2_records_read_without_integrity_fields(tmp_path: Path) -> None:
    old = json.loads(traj().model_dump_json())
    old["schema_version"] = 2
    del old["integrity"]
    path = tmp_path / "v2.jsonl"
    path.write_text(json.dumps(old) + "\n")
    [t] = read_trajectories(path)
    assert t.integrity == [] and t.schema_version == SCHEMA_VERSION == 3


# -- rescore and snapshot rows -----------------------------------------------------------------------------------------

async def test_rescore_flags_a_tampered_component_and_reproduces_honest_ones() -> None:
    from agentrl.replay import rescore_with

    specs = parse_reward_list([{"unit_tests": 1.0}, {"format": 0.5}], "t")
    honest = await Scorer(specs).score(traj(tid="a"))
    tampered = honest.model_copy(update={"id": "b", "reward_components": {"unit_tests": 1.0, "format": 0.0}})
    rows = await rescore_with([honest, tampered])  # the recorded meta.reward
    assert [r.differs for r in rows] == [False, True]
    assert rows[0].rescored.reward == honest.reward == 1.5


def test_snapshot_row_metrics() -> None:
    from agentrl.trainer.snapshots import behaviour_row

    good = traj(tid="a", model_tokens=10).model_copy(update={"reward": 1.0, "reward_components": {"unit_tests": 1.0}})
    cut = traj(tid="b", model_tokens=30, passed=0, finish="length", status=Status.truncated,
               tool_error="unknown_tool").model_copy(update={"reward": 0.0, "reward_components": {"unit_tests": 0.0}})
    infra = traj(tid="c", status=Status.infra_error)
    row = behaviour_row(3, "greedy", [good, cut, infra], rollouts="x.jsonl", time_s=1.0)
    assert row["step"] == 3 and row["mode"] == "greedy" and row["trajectories"] == 3 and row["infra_errors"] == 1
    assert row["reward_mean"] == 0.5 and row["pass_rate"] == 0.5 and row["completion_len_mean"] == 20.0
    assert row["format_rate"] == 0.5 and row["tool_error_rate"] == 0.5 and row["truncation_rate"] == 0.5
    assert row["reward_components"] == {"unit_tests": 0.5}


def test_resume_drops_snapshot_rows_after_the_checkpoint(tmp_path: Path) -> None:
    from agentrl.trainer.resume import prepare_resume

    (tmp_path / "snapshots.jsonl").write_text("".join(json.dumps({"step": s, "mode": "greedy"}) + "\n"
                                                      for s in (0, 1, 2)))
    ckpt = tmp_path / "checkpoints" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    assert prepare_resume(tmp_path, 8).step == 1
    steps = [json.loads(x)["step"] for x in (tmp_path / "snapshots.jsonl").read_text().splitlines()]
    assert steps == [0, 1]


def test_snapshot_config_rules() -> None:
    from pydantic import ValidationError

    from agentrl.trainer.config import TrainConfig

    with pytest.raises(ValidationError, match="multiple of checkpoint_every"):
        TrainConfig.model_validate({"checkpoint_every": 2, "snapshot": {"every": 3}})
    with pytest.raises(ValidationError, match="nothing would run"):
        TrainConfig.model_validate({"snapshot": {"every": 1, "samples": 0}})
    assert TrainConfig.model_validate({"snapshot": {"every": 2, "tasks": ["a", "b"]}}).snapshot.tasks == ["a", "b"]


def test_rescore_reward_flag_reads_lists_and_configs_and_names_bad_files(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl.cli import main

    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append_group([score(traj(tid="a", passed=1))])
    flow = tmp_path / "flow.yaml"
    flow.write_text("[{unit_tests: 1.0}]")
    assert main(["rescore", str(path), "--reward", str(flow)]) == 0
    job = tmp_path / "job.yaml"
    job.write_text("env: code_tests\nreward:\n  - {unit_tests: 2.0}\n")
    assert main(["rescore", str(path), "--reward", str(job)]) == 1  # twice the stored reward
    assert "1 rewards differ" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("reward: [{length_penalty: {alfa: 1}}]\n")
    assert main(["rescore", str(path), "--reward", str(bad)]) == 2
    assert "field 'alfa': unknown option" in capsys.readouterr().err
