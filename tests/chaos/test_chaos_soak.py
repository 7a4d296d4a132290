"""The chaos soak, small (the chaos tier, `pytest -m chaos tests/chaos`, `make test-chaos`): 26 trajectories through
the real `agentrl rollout` on local bubblewrap sandboxes, with every host-side fault kind (sandbox deleted,
bubblewrap killed, agent SIGKILLed; between commands and during one), engine connection resets, reward-service 503s
and a set of policy attacks from the one list of `agentrl.testing.scripted_attacks` (forged verdicts, kill -1 during
grading, a symlink chain over solution.py, a fork bomb, a memory bomb, a daemon, and tool-call JSON with a
5,000-digit integer, lone surrogates and 5,000-deep nesting), at known counts. benchmarks/bench_chaos.py runs the same
harness at full size and times it.

The invariants of issue 22: no trajectory lost and the run completes; every injected outside fault recorded as
infra_error and retried to a fully scored record (or absorbed by the client's own retry); every attack scored (never
infra_error, never retried, reward 0); honest trajectories get the full reward."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from chaos_judge import judge
from chaos_plan import ENV_OPTIONS, make_plan
from chaos_run import run_once

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ["huge_integer_json", "lone_surrogates_json", "deep_nesting_json", "forged_verdicts_and_exit",
           "kill_all_during_grading", "solution_symlink_chain", "fork_bomb", "memory_bomb", "daemon_rewrites_solution"]


def _root_bwrap_problem() -> str | None:
    import shutil

    if shutil.which("bwrap") is None:
        return "bubblewrap not installed (apt-get install -y bubblewrap)"
    if os.geteuid() != 0:
        return "the host-side faults and uid-separated local sandboxes need the host side to run as root"
    return None


pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1200),
              pytest.mark.skipif(_root_bwrap_problem() is not None, reason=_root_bwrap_problem() or "")]


async def test_small_chaos_soak_on_local_sandboxes(tmp_path: Path, smollm2_path: Path, smollm2_tokenizer: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.envs import get_env

    # the CLI child runs this checkout's agentrl and code_tests env (its cwd is the workdir)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), str(ROOT / "envs" / "code_tests"), os.environ.get("PYTHONPATH", "")]))
    tasks = list(get_env("code_tests", **ENV_OPTIONS).tasks())[:2]
    plan = make_plan([t.id for t in tasks], 13, seed=3, attack_rate=0.35, fault_rate=0.5, backend="local",
                     attacks=ATTACKS)
    run = await run_once(backend="local", tasks=tasks, group_size=13, seed=3, plan=plan, chaos=True,
                         tokenizer=smollm2_tokenizer, model_path=smollm2_path, concurrency=8, workdir=tmp_path)
    report = judge(run, plan)

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
