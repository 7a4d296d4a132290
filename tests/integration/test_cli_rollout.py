"""`agentrl rollout` as a user runs it (a subprocess): real engine (tiny model), real sandboxes, real store.

Crash safety: kill -9 in the middle of a run, then --resume: no duplicated and no lost groups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agentrl.store import read_trajectories


def _cmd(model: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentrl.cli", "rollout", "--env", "code_tests", "--model", str(model),
            "--group-size", "2", "--max-turns", "2", "--max-new-tokens", "24", "--out", str(out), "--seed", "3",
            *extra]


def _run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_rollout_writes_trajectories_and_summary(eos_prone_model: Path, tmp_path: Path) -> None:
    out, summary = tmp_path / "t.jsonl", tmp_path / "s.json"
    r = _run(_cmd(eos_prone_model, out, "--tasks", "2", "--summary-json", str(summary)))
    assert r.returncode == 0, r.stderr[-3000:]
    trajs = read_trajectories(out)
    assert len(trajs) == 4 and len({t.task_id for t in trajs}) == 2
    assert all(t.meta["seed"] == 3 and t.meta["engine"]["engine"] == "local" for t in trajs)
    s = json.loads(summary.read_text())
    assert s["trajectories"] == 4 and "pass_at_1" in s and s["tokens_generated"] > 0
    assert "rollout summary" in r.stdout + r.stderr
    # the CLI root installed a collector monitor and reports what the collector cost (gc_tune on: few collections)
    assert len(s["gc"]["gc_collections"]) == 3 and s["gc"]["gc_s"] >= 0
    assert "gc: [" in r.stdout + r.stderr
    assert s["loop_lag"]["ticks"] > 0 and s["loop_lag"]["max_ms"] >= s["loop_lag"]["p99_ms"] >= 0
    assert "event loop lag: p50" in r.stdout + r.stderr


def test_existing_out_needs_resume_and_nothing_is_lost(eos_prone_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert _run(_cmd(eos_prone_model, out, "--tasks", "1")).returncode == 0
    before = out.read_bytes()
    r = _run(_cmd(eos_prone_model, out, "--tasks", "1"))
    assert r.returncode == 2 and "--resume" in r.stderr
    assert out.read_bytes() == before


def test_config_error_names_field(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("group_size: 2\nbudgets:\n  max_turn: 3\n")
    r = _run([sys.executable, "-m", "agentrl.cli", "rollout", "--config", str(cfg)], timeout=60)
    assert r.returncode == 2 and "budgets.max_turn" in r.stderr and str(cfg) in r.stderr


def test_kill9_then_resume_no_duplicates_no_loss(eos_prone_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    n_tasks = 10
    proc = subprocess.Popen(_cmd(eos_prone_model, out, "--tasks", str(n_tasks), "--concurrency", "1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and len(out.read_bytes().splitlines()) >= 4:  # two groups stored
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed: " + proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(read_trajectories(out))
    assert killed_at < 2 * n_tasks
    r = _run(_cmd(eos_prone_model, out, "--tasks", str(n_tasks), "--resume"))
    assert r.returncode == 0, r.stderr[-3000:]
    trajs = read_trajectories(out)
    per_task = Counter(t.task_id for t in trajs)
    assert len(per_task) == n_tasks and set(per_task.values()) == {2}, per_task
    assert len({t.id for t in trajs}) == len(trajs)
    groups = Counter(t.group_id for t in trajs)
    assert set(groups.values()) == {2}


@pytest.mark.parametrize("argv", [["envs", "list"]])
def test_envs_list(argv: list[str]) -> None:
    r = _run([sys.executable, "-m", "agentrl.cli", *argv], timeout=60)
    assert r.returncode == 0 and "code_tests" in r.stdout
