"""Issue 14 acceptance for reward sources and behaviour snapshots: a job with
`reward: [{unit_tests: 1.0}, {length_penalty: {weight: 1.0, expected_tokens: 256}}, {http: {url: ..., weight: 0.5}}]`
against the reference service (`agentrl reward serve`, a real subprocess) trains 2 steps on CPU (tiny model, real
sandboxes); every scored trajectory stores its three components and reward = their weighted sum; snapshots are
written every step with their rollouts under the checkpoint; `agentrl rescore --reward` reproduces the stored
rewards exactly; with the service down a trajectory is infra_error (retried, reward None), never 0.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trainer_toys import PrintNumberEnv, cached_taught_model

from agentrl.cli import main
from agentrl.cli.train import run_train
from agentrl.compose import make_scorer
from agentrl.replay import rescore_with
from agentrl.reward import parse_reward_list
from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.store import read_trajectories
from agentrl.testing.scripted import ScriptedEngine
from agentrl.tools.render import ChatRenderer
from agentrl.trainer.config import TrainConfig
from agentrl.types import SamplingParams, Status


@pytest.fixture(scope="module")
def reward_service() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "reward", "serve", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "listening on " in line, f"agentrl reward serve did not start: {line!r}"
        yield line.split("listening on ")[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _reward(url: str) -> list[dict[str, Any]]:
    return [{"unit_tests": 1.0}, {"length_penalty": {"weight": 1.0, "expected_tokens": 256}},
            {"http": {"url": url, "weight": 0.5}}]


@pytest.fixture(scope="module")
def run(smollm2_path: Path, reward_service: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rtrain") / "run"
    cfg = TrainConfig.model_validate({
        "model": str(cached_taught_model(smollm2_path)), "env": "print_number", "env_options": {"tasks": 8},
        "group_size": 4, "batch_size": 2, "micro_batch_size": 4, "steps": 2, "learning_rate": 2e-3,
        "sampling": {"temperature": 1.0, "max_new_tokens": 24},
        "budgets": {"max_turns": 2, "max_completion_tokens": 80, "tool_timeout_s": 120},
        "sandbox": {"warm": 2, "max_sandboxes": 8}, "max_trajectories": 8, "output_dir": str(out), "seed": 0,
        "reward": _reward(reward_service), "snapshot": {"every": 1, "tasks": 2, "samples": 1, "greedy": True}})
    assert run_train(cfg).steps_done == 2
    return out


def test_components_stored_and_reward_is_their_weighted_sum(run: Path) -> None:
    trajs = read_trajectories(run / "trajectories.jsonl")
    assert len(trajs) == 16
    scored = [t for t in trajs if t.status is not Status.infra_error]
    assert scored, "every training trajectory was an infra error"
    for t in scored:
        c = t.reward_components
        assert set(c) == {"unit_tests", "length_penalty", "http"}
        assert t.reward == 0.0 + 1.0 * c["unit_tests"] + 1.0 * c["length_penalty"] + 0.5 * c["http"]
        assert c["unit_tests"] == t.tests.fraction  # type: ignore[union-attr]
        assert c["length_penalty"] == 0.0  # at most 80 completion tokens: never beyond 256
    assert any(t.reward_components["http"] > 0 for t in scored) or all(t.reward_components["unit_tests"] == 0
                                                                       for t in scored)


def test_snapshots_every_step_with_rollouts_under_the_checkpoint(run: Path) -> None:
    rows = [json.loads(line) for line in (run / "snapshots.jsonl").read_text().splitlines()]
    assert [(r["step"], r["mode"]) for r in rows] == [(s, m) for s in (0, 1, 2) for m in ("sampled", "greedy")]
    for r in rows:
        assert r["trajectories"] == 2
        for key in ("reward_mean", "pass_rate", "completion_len_mean", "format_rate", "tool_error_rate",
                    "truncation_rate"):
            assert key in r
    assert [r["rollouts"] for r in rows[::2]] == ["checkpoints/start/snapshot.jsonl",
                                                  "checkpoints/checkpoint-1/snapshot.jsonl",
                                                  "checkpoints/checkpoint-2/snapshot.jsonl"]
    for r in rows:
        stored = [t for t in read_trajectories(run / r["rollouts"]) if t.meta["snapshot_mode"] == r["mode"]]
        assert len(stored) == 2 and {t.step for t in stored} == {r["step"]}
        assert all(t.reward is None or set(t.reward_components) == {"unit_tests", "length_penalty", "http"}
                   for t in stored)
        if r["mode"] == "greedy":
            assert all(t.meta["snapshot"] == r["step"] for t in stored)
    assert (run / "checkpoints" / "checkpoint-1" / "trainer_state.json").is_file()


def test_rescore_reproduces_the_stored_rewards_exactly(run: Path, reward_service: str, tmp_path: Path) -> None:
    trajs = read_trajectories(run / "trajectories.jsonl")
    rows = asyncio.run(rescore_with(trajs, parse_reward_list(_reward(reward_service), "t")))
    assert [r.error for r in rows] == [None] * len(trajs)
    assert [r.rescored.reward for r in rows] == [t.reward for t in trajs]
    assert [r.rescored.reward_components for r in rows] == [t.reward_components for t in trajs]
    config = tmp_path / "reward.yaml"
    config.write_text(json.dumps({"reward": _reward(reward_service)}))
    assert main(["rescore", str(run / "trajectories.jsonl"), "--reward", str(config)]) == 0
    assert main(["rescore", str(run / "trajectories.jsonl")]) == 0  # the recorded meta.reward
    other = tmp_path / "other.yaml"
    other.write_text("- {unit_tests: 1.0}\n- {format: 0.25}\n")
    assert main(["rescore", str(run / "trajectories.jsonl"), "--reward", str(other)]) == 1  # a different reward


def test_view_of_the_run_dir(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["view", str(run), "-o", str(out)]) == 0
    page = out.read_text()
    assert 'id="snapshots"' in page and "greedy: format compliance" in page


def test_reward_service_down_is_infra_error_not_zero(smollm2_tokenizer: Any) -> None:
    env = PrintNumberEnv(tasks=1)
    task = env.tasks()[0]
    engine = ScriptedEngine(smollm2_tokenizer, ["```python\nprint(11)\n```"])
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(smollm2_tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=64,
                                              stop_token_ids=[smollm2_tokenizer.eos_token_id]),
                      budgets=Budgets(max_turns=1, max_completion_tokens=256, context_window=4096))
    specs = parse_reward_list([{"unit_tests": 1.0}, {"http": {"url": "http://127.0.0.1:9/score", "retries": 1,
                                                              "backoff_s": 0.01}}], "t")

    async def go() -> Any:
        pool = SandboxPool(backend="local", spec=SandboxSpec(default_timeout_s=10), warm=0, max_sandboxes=1,
                           run_id=uuid.uuid4().hex[:8])
        async with pool, make_scorer(specs, env) as scorer:
            sched = Scheduler(rollout, pool, SchedulerConfig(group_size=1, infra_retries=1), scorer=scorer)
            return await sched.run_one(task, group_id="g", sample_index=0)

    traj = asyncio.run(go())
    assert traj.status is Status.infra_error and traj.reward is None and traj.reward_components == {}
    assert traj.attempt == 0  # the scoring was retried (retries: 1), never the episode
    assert "RewardServiceError" in (traj.error or "") and "127.0.0.1:9" in (traj.error or "")
    assert traj.tests is not None and traj.tests.passed == 2  # the tests passed: only the reward service failed
