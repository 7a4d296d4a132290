"""Learning check (slow tier): GRPO through the real runner and sandboxes raises the reward of a policy on an env
where reward is reachable, for 3 seeds.

Env: `print_number` (tests/integration/trainer_toys.py): reply with a ```python block; reward 0.5 if it prints an
integer, 1.0 if it prints the task's number. Policy: the tiny model taught the format (it prints an integer about
half the time, otherwise a string or broken code). 4 tasks x 8 samples per step. Passing: mean reward over the last
6 of 24 steps is higher than over the first 6, for each of seeds 0, 1, 2.
Run: `pytest -m slow tests/slow/test_learning.py -s` (~5 min on 2 cores); the per-seed numbers are printed and go
to BENCHMARKS.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))

from trainer_toys import cached_taught_model

from agentrl.cli.train import run_train
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

STEPS, WINDOW = 24, 6


def _job(model: Path, out: Path, seed: int) -> TrainConfig:
    return TrainConfig.model_validate({
        "model": str(model), "env": "print_number", "env_options": {"tasks": 32}, "group_size": 8, "batch_size": 4,
        "steps": STEPS, "learning_rate": 1e-3, "mask_truncated_completions": False,
        "sampling": {"temperature": 1.0, "max_new_tokens": 40}, "budgets": {"max_turns": 1, "max_completion_tokens": 40},
        "sandbox": {"warm": 8, "max_sandboxes": 32}, "max_trajectories": 32, "checkpoint_every": STEPS,
        "output_dir": str(out), "seed": seed})


@pytest.mark.slow
def test_reward_rises_for_three_seeds(smollm2_path: Path, tmp_path: Path) -> None:
    taught_model = cached_taught_model(smollm2_path)
    results = {}
    for seed in (0, 1, 2):
        out = tmp_path / f"seed{seed}"
        run_train(_job(taught_model, out, seed))
        rewards = [row["reward_mean"] for row in read_metrics(out / "metrics.jsonl")]
        assert len(rewards) == STEPS
        results[seed] = {"first": mean(rewards[:WINDOW]), "last": mean(rewards[-WINDOW:]), "rewards": rewards}
    print("\nlearning check:", json.dumps({s: {k: v for k, v in r.items() if k != "rewards"}
                                           for s, r in results.items()}))
    for seed, r in results.items():
        assert r["last"] > r["first"], f"seed {seed}: reward did not rise ({r})"
