"""The composition root (agentrl/compose.py) is what every entry point builds from: one job gives one `config_hash`
whether it is rolled out (`agentrl rollout`, run here in-process over real sandboxes and a real tiny model), trained
(`agentrl train`'s parts) or evaluated (`agentrl eval`'s parts, with the eval overrides a user passes). The old entry
points hashed `RolloutConfig` minus outputs in one place and the whole `TrainConfig` in another."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentrl.cli.train import eval_parts, train_parts
from agentrl.cli.wiring import run_rollout
from agentrl.compose import build_run, config_hash
from agentrl.store import read_trajectories
from agentrl.trainer.config import TrainConfig


def job(model: Path, out: Path, **overrides: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "model": str(model), "env": "code_tests", "tasks": 1, "group_size": 2, "batch_size": 1, "steps": 1,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8}, "budgets": {"max_turns": 1},
        "sandbox": {"warm": 0, "max_sandboxes": 2}, "max_trajectories": 2, "output_dir": str(out), "seed": 3,
        "eval_every": 1, "eval": {"tasks": 1, "samples": 1}}
    data.update(overrides)
    return TrainConfig.model_validate(data)


def test_one_job_hashes_the_same_from_every_entry_point(tiny_model_path: Path, tmp_path: Path) -> None:
    cfg = job(tiny_model_path, tmp_path / "run")

    # agentrl rollout of the job's rollout view, written somewhere else with a summary (outputs are not hashed)
    view = cfg.rollout_config().model_copy(update={"out": tmp_path / "rollout.jsonl", "resume": False,
                                                   "summary_json": tmp_path / "summary.json"})
    assert asyncio.run(run_rollout(view)) == 0
    rolled = {t.meta["config_hash"] for t in read_trajectories(tmp_path / "rollout.jsonl")}

    # agentrl train: the parts the job is built from
    parts = train_parts(cfg)
    try:
        trained = {parts.run.config_hash, parts.run.meta["config_hash"],
                   parts.run.scheduler().meta["config_hash"]}
    finally:
        asyncio.run(parts.run.aclose())

    # agentrl eval of a checkpoint with --tasks / --samples / --no-greedy overrides (they pick what is evaluated, not
    # how a trajectory is made)
    evaluated = job(tiny_model_path, tmp_path / "run", eval={"tasks": 1, "samples": 3, "greedy": False})
    eparts = asyncio.run(eval_parts(evaluated, tiny_model_path))
    try:
        scored = {eparts.config_hash, eparts.meta["config_hash"]}
    finally:
        asyncio.run(eparts.aclose())

    assert len(rolled | trained | scored) == 1, (rolled, trained, scored)
    assert rolled == {config_hash(cfg)} == {config_hash(view)}

    # ... and a different job hashes differently
    assert config_hash(job(tiny_model_path, tmp_path / "run", seed=4)) != config_hash(cfg)
    assert config_hash(job(tiny_model_path, tmp_path / "run", budgets={"max_turns": 2})) != config_hash(cfg)


def test_parts_carry_the_run_sampling_and_budgets(tiny_model_path: Path, tmp_path: Path) -> None:
    """Sampling and budgets are computed once, in the root: stop ids default to the engine's end-of-turn ids, the
    seed to the job's, the context window to the engine's; every scheduler it builds runs with them."""
    cfg = job(tiny_model_path, tmp_path / "run")
    parts = build_run(cfg)
    try:
        assert parts.sampling.stop_token_ids == list(parts.engine.eos_token_ids)
        assert parts.sampling.seed == cfg.seed
        assert parts.budgets.context_window == parts.engine.context_window
        sched = parts.scheduler(group_size=5, namespace="|x")
        assert sched.rollout.sampling == parts.sampling and sched.rollout.budgets == parts.budgets
        assert sched.config.group_size == 5 and sched.config.namespace == "|x"
        assert sched.pool is parts.pool and sched.scorer is parts.scorer
        assert parts.scheduler(shares_slots_with=sched).slots is sched.slots
    finally:
        asyncio.run(parts.aclose())
