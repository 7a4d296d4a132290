"""Reproducible runs (issue 16), end to end on real sandboxes and a real (tiny, tool-using) model.

Two `agentrl rollout --deterministic --seed 7` runs — the second with CPU-burning processes beside it and random
extra latency in every tool call — store identical trajectories (`agentrl diff` exits 0). Two `agentrl train --deterministic` runs of 2 steps write the same
metrics (timings aside) and checkpoints with the same tensor bytes.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from trainer_toys import PrintNumberEnv, cached_taught_model

from agentrl.cli import main
from agentrl.envs import register_env
from agentrl.store import read_trajectories
from agentrl.types import ToolCall, ToolResult

_JITTER = random.SystemRandom()  # never seeded by the run (run_rollout seeds the `random` module)


@register_env("print_number_jitter")
class JitteryPrintNumberEnv(PrintNumberEnv):
    """print_number whose sandbox setup and tool calls take a random extra 0-250 ms."""

    async def setup(self, sandbox: Any, task: Any) -> None:
        await asyncio.sleep(_JITTER.uniform(0.0, 0.25))
        await super().setup(sandbox, task)

    async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Any) -> ToolResult:
        await asyncio.sleep(_JITTER.uniform(0.0, 0.25))
        return await super().call_tool(sandbox, call, task=task)


@pytest.fixture(scope="module")
def taught_model(smollm2_path: Path) -> Path:
    return cached_taught_model(smollm2_path)


@contextmanager
def cpu_burners(n: int = 2) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _rollout(model: Path, out: Path, seed: int) -> None:
    code = main(["rollout", "--env", "print_number_jitter", "--model", str(model), "--tasks", "3",
                 "--group-size", "2", "--max-turns", "3", "--max-new-tokens", "32", "--temperature", "1.0",
                 "--seed", str(seed), "--deterministic", "--out", str(out)])
    assert code == 0


def test_two_deterministic_rollouts_store_identical_trajectories(taught_model: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _rollout(taught_model, a, seed=7)
    with cpu_burners():
        _rollout(taught_model, b, seed=7)
    trajs = read_trajectories(a)
    assert len(trajs) == 6 and any(t.num_tool_calls >= 2 for t in trajs)  # multi-turn, tool latency mattered
    by_task: dict[str, list[list[int]]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t.completion_ids)
    assert any(x != y for x, y in by_task.values())  # samples of a group differ: sampled, not trivially equal
    assert sorted(t.id for t in trajs) == sorted(t.id for t in read_trajectories(b))
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "--no-decode"]) == 0
    assert capsys.readouterr().out.strip().endswith("identical")


def _train(model: Path, out: Path) -> None:
    from agentrl.cli.train import run_train
    from agentrl.trainer.config import TrainConfig

    cfg = TrainConfig.model_validate({
        "model": str(model), "env": "print_number", "env_options": {"tasks": 4}, "group_size": 2, "batch_size": 2,
        "steps": 2, "learning_rate": 2e-3, "sampling": {"temperature": 1.0, "max_new_tokens": 24},
        "budgets": {"max_turns": 2, "max_completion_tokens": 80, "tool_timeout_s": 120},
        "sandbox": {"warm": 2, "max_sandboxes": 4}, "max_trajectories": 4, "output_dir": str(out), "seed": 3,
        "deterministic": True})
    assert run_train(cfg).steps_done == 2


def _tensors(checkpoint: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    weights = load_file(checkpoint / "model.safetensors")
    optim = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
    states = {f"optim.{i}.{k}": v for i, s in optim["state"].items() for k, v in s.items() if torch.is_tensor(v)}
    return {**weights, **states}


def test_two_deterministic_training_runs_give_identical_metrics_and_checkpoints(
        taught_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from agentrl.trainer.metrics import is_timing, read_metrics

    a, b = tmp_path / "a", tmp_path / "b"
    _train(taught_model, a)
    _train(taught_model, b)
    untimed = [[{k: v for k, v in row.items() if not is_timing(k)} for row in read_metrics(d / "metrics.jsonl")]
               for d in (a, b)]
    assert len(untimed[0]) == 2 and untimed[0] == untimed[1]
    assert untimed[0][0]["loss"] is not None and untimed[0][0]["model_tokens"] > 0
    for step in (1, 2):
        ta, tb = (_tensors(d / "checkpoints" / f"checkpoint-{step}") for d in (a, b))
        assert ta.keys() == tb.keys() and len(ta) > 0
        assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert (a / "checkpoints/checkpoint-2/model.safetensors").read_bytes() == \
        (b / "checkpoints/checkpoint-2/model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "--no-decode"]) == 0
