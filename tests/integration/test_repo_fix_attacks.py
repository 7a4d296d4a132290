"""Grader hacks against repo_fix, through the real local (bubblewrap) sandbox and `RepoFixEnv.score_solution` (the path
of `agentrl envs check`): a "fix" that leaves the bug in place and adds code to a source file of the package (no
conftest, no test file: those changes are dropped) to get a pass from the test machinery instead.

Each attack must score 0 with the reason in the report; the old grader (JUnit report in a directory the graded uid
could write, marker-word check) paid 1.0 for the atexit rewrite and the report-forging patches. The reference
solution of the same task still scores 1.0 on the same path.
"""

from __future__ import annotations

import shutil
import uuid
from typing import Any

import pytest
from agentrl_repo_fix import RepoFixEnv, trees

from agentrl.sandbox import SandboxPool
from agentrl.testing.grader_attacks import REPO_FIX_ATTACKS, REPO_FIX_REASONS

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
PACKAGE = "inflection"

ATTACKS, REASONS = REPO_FIX_ATTACKS, REPO_FIX_REASONS  # agentrl.testing.grader_attacks: every tier runs them


@pytest.fixture(scope="module")
def env() -> RepoFixEnv:
    env = RepoFixEnv(packages=[PACKAGE])
    env.prepare(say=lambda _: None)  # the package's sdist and test venv, as `envs check` fetches them
    return env


async def _score(env: RepoFixEnv, task: Any, solution: str) -> Any:
    async with SandboxPool(backend="local", spec=env.sandbox_spec, warm=1, max_sandboxes=1,
                           run_id=uuid.uuid4().hex[:8], backend_options={"ro_binds": env.ro_binds()}) as pool:
        async with pool.lease() as sb:
            return await env.score_solution(sb, task, solution)


def _attack_patch(env: RepoFixEnv, task: Any, code: str) -> str:
    """The attack appended to the buggy source file (the bug stays)."""
    buggy = env.buggy(task.data)
    path = str(task.data["file"])
    return trees.diff(buggy, {**buggy, path: buggy[path] + b"\n" + code.encode()})




@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_attack_from_the_packages_source_scores_zero(env: RepoFixEnv, attack: str) -> None:
    task = env.tasks()[0]
    report = await _score(env, task, _attack_patch(env, task, ATTACKS[attack]))
    assert (report.passed, report.total) == (0, 1), report.outcomes[:3]
    assert report.error and "tampering" in report.error and REASONS[attack] in report.error, report.error
    assert report.outcomes[0].message == report.error
    if "tampering" in report.error:  # the integrity monitor sees it too (agentrl.runner.integrity)
        names = [sig.name for sig in report.signals]
        # a forged "passed" report also fails the judge (the test made none of the original's checks)
        assert "test_tamper" in names and set(names) <= {"test_tamper", "rigged_comparison"}, report.signals


async def test_the_reference_of_the_attacked_task_still_scores_one(env: RepoFixEnv) -> None:
    task = env.tasks()[0]
    report = await _score(env, task, env.reference_solution(task) or "")
    assert (report.passed, report.total, report.error) == (1, 1, None), report.outcomes[:3]


async def test_a_tampering_episode_through_the_runner_scores_zero_and_raises_test_tamper(env: RepoFixEnv,
                                                                                       smollm2_tokenizer: Any) -> None:
    """Through the real runner (scripted model, fresh grading sandbox): the policy appends the atexit report rewrite
    to the package's source with the editor tool and submits. The episode is scored 0 (never unscored) and its
    trajectory carries the grader's test_tamper signal at grading; the signal does not change the reward."""
    from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
    from agentrl.testing.scripted import ScriptedEngine, hermes_call
    from agentrl.tools.render import ChatRenderer
    from agentrl.types import SamplingParams, Status

    task = env.tasks()[0]
    path = str(task.data["file"])
    last = env.buggy(task.data)[path].decode().rstrip("\n").splitlines()[-1]
    replies = [hermes_call("str_replace_editor", command="str_replace", path=path, old_str=last,
                           new_str=last + "\n" + ATTACKS["atexit_rewrites_the_report"]),
               hermes_call("submit")]
    engine = ScriptedEngine(smollm2_tokenizer, replies, context_window=32768)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(smollm2_tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=2048,
                                              stop_token_ids=[smollm2_tokenizer.eos_token_id]),
                      budgets=Budgets(max_turns=4, max_completion_tokens=30000, context_window=32768,
                                      tool_timeout_s=120))
    async with SandboxPool(backend="local", spec=env.sandbox_spec, warm=1, max_sandboxes=2,
                           run_id=uuid.uuid4().hex[:8], backend_options={"ro_binds": env.ro_binds()}) as pool:
        traj = await Scheduler(rollout, pool, SchedulerConfig(group_size=1)).run_one(task, group_id="g",
                                                                                     sample_index=0)
    assert traj.turns[0].tool_results[0].error is None, traj.turns[0].tool_results[0].output
    assert traj.status is not Status.infra_error and traj.reward == 0.0, (traj.status, traj.error, traj.tests)
    assert [(sig.name, sig.turn) for sig in traj.integrity] == [("test_tamper", None)], traj.integrity
    assert "atexit hook was registered" in traj.integrity[0].detail
