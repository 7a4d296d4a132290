"""The chaos soak (benchmarks/bench_chaos.py), small: 26 trajectories through the real `agentrl rollout` on local
bubblewrap sandboxes, with every host-side fault kind (sandbox deleted, bubblewrap killed, agent SIGKILLed; between
commands and during one), engine connection resets, reward-service 503s and a set of policy attacks (forged verdicts,
kill -1 during grading, a symlink chain over solution.py, a fork bomb, a memory bomb, a daemon, and tool-call JSON
with a 5,000-digit integer, lone surrogates and 5,000-deep nesting), at known counts.

The invariants of issue 22: no trajectory lost and the run completes; every injected outside fault recorded as
infra_error and retried to a fully scored record (or absorbed by the client's own retry); every attack scored (never
infra_error, never retried, reward 0); honest trajectories get the full reward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from local_sandbox_support import root_bwrap_problem

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ["huge_integer_json", "lone_surrogates_json", "deep_nesting_json", "forged_verdicts_and_exit",
           "kill_all_during_grading", "solution_symlink_chain", "fork_bomb", "memory_bomb", "daemon_rewrites_solution"]

pytestmark = pytest.mark.skipif(root_bwrap_problem() is not None, reason=root_bwrap_problem() or "")


def test_small_chaos_soak_on_local_sandboxes(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), str(ROOT / "envs" / "code_tests"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_chaos.py"), "--backend", "local", "--tasks", "2",
           "--group-size", "13", "--seed", "3", "--fault-rate", "0.5", "--attack-rate", "0.35", "--concurrency", "8",
           "--no-clean", "--attacks", *ATTACKS, "--workdir", str(tmp_path), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert out.exists(), f"the soak wrote no report (exit {proc.returncode}): {proc.stderr[-3000:]}"
    (report,) = json.loads(out.read_text())

    # the plan is what was asked: known counts of every category, every fault kind present
    assert report["requested"] == 26
    assert (report["faults_planned"], report["attacks_planned"], report["honest"]["n"]) == (13, 9, 4)
    assert len(report["faults"]) == 10 and sorted(report["attacks"]) == sorted(ATTACKS)

    problems = {
        "lost": (report["lost"], report["rc"], report.get("stderr_tail", "")[-1500:]),
        "faults not recorded infra + retried": {k: f["bad"] for k, f in report["faults"].items() if f["bad"]},
        "attacks not scored": {k: a["bad"] for k, a in report["attacks"].items() if a["bad"]},
        "honest not fully scored": report["honest"]["bad"],
    }
    assert all(report["invariants"].values()), json.dumps(problems, default=str)[:6000]
    assert report["faults_injected"] == report["faults_planned"], "every planned fault hit its trajectory"
    assert proc.returncode == 0, proc.stderr[-3000:]
