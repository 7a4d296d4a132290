"""A test passes only on values the test can trust (issue 31, item 4), through the real grader: the local (bubblewrap)
sandbox and `RepoFixEnv.score_solution`, the path of `agentrl envs check`.

A "fix" that leaves the bug in place and returns objects whose own methods decide the tests' checks (`__eq__`,
`__bool__`, `__len__`, `__iter__`, a metaclass's `__instancecheck__`) is scored 0 and raises `rigged_comparison`.
The grader used to pay 1.0 for every one of them: the graded code ran inside pytest and its objects were asked
whether they were right. Legitimate fixes, the reference and one that is written differently (its own helper class
with ordinary equality), still score 1 with no signal.

Besides inflection's real task, a small synthetic task (a package of our own, on inflection's test venv) has one
FAIL_TO_PASS test per kind of check, so each attack is seen on the check it rigs.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from agentrl_repo_fix import RepoFixEnv, trees
from agentrl_repo_fix.build import TASK_FORMAT

from agentrl.sandbox import SandboxPool
from agentrl.testing.grader_attacks import RIG, RIG_META

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

# RIG / RIG_META (agentrl.testing.grader_attacks): a failing call returns an object whose own methods answer every
# check; the metaclass variant also says every object is an instance of the package's classes
MINI_FIXED = '''"""A small package of our own for the synthetic task."""


class Meta(type):
    pass


class Box(metaclass=Meta):
    def __init__(self, items):
        self.items = list(items)

    def __eq__(self, other):
        return isinstance(other, Box) and self.items == other.items

    __hash__ = None

    def __len__(self):
        return len(self.items)


def evens(xs):
    return Box(x for x in xs if x % 2 == 0)


def has_even(xs):
    return any(x % 2 == 0 for x in xs)


def words(text):
    return text.split()


def double(x):
    return 2 * x


class ParseError(ValueError, metaclass=Meta):
    pass


def parse(text):
    if not text.isdigit():
        raise ParseError(text)
    return int(text)
'''
MINI_TESTS = '''import unittest

import pytest

import mini


def test_eq():
    assert mini.evens([1, 2, 3, 4]) == mini.Box([2, 4])


def test_truth():
    assert mini.has_even([1, 2])


def test_len():
    assert len(mini.evens([2, 4, 6])) >= 3


def test_isinstance():
    assert isinstance(mini.evens([2]), mini.Box)


def test_loop():
    for w in mini.words("a b"):
        assert w in ("a", "b")


class TestUnit(unittest.TestCase):
    def test_assert_equal(self):
        self.assertEqual(mini.evens([1, 2]), mini.Box([2]))


def test_double():
    assert mini.double(21) == 42


def test_raises():
    with pytest.raises(mini.ParseError):
        mini.parse("x1")
'''
F2P = ["test_mini::test_eq", "test_mini::test_truth", "test_mini::test_len", "test_mini::test_isinstance",
       "test_mini::test_loop", "test_mini.TestUnit::test_assert_equal", "test_mini::test_raises"]


def _bugged(src: str) -> str:
    """The synthetic task's bug: every function but `double` raises."""
    out = []
    for line in src.splitlines():
        out.append(line)
        if line.startswith("def ") and not line.startswith("def double"):
            out.append("    raise NotImplementedError('the bug')")
    return "\n".join(out) + "\n"


def _synthetic_row(env: RepoFixEnv) -> dict[str, Any]:
    base = env.pristine({"package": "inflection", "version": "0.5.1"})
    buggy = {**base, "mini/__init__.py": _bugged(MINI_FIXED).encode(), "test_mini.py": MINI_TESTS.encode()}
    fixed = {**buggy, "mini/__init__.py": MINI_FIXED.encode()}
    return {"format": TASK_FORMAT, "id": "mini-000", "package": "inflection", "version": "0.5.1", "split": "train",
            "bug_diff": trees.diff(base, buggy), "reference_diff": trees.diff(buggy, fixed), "file": "mini/__init__.py",
            "fail_to_pass": F2P, "pass_to_pass": ["test_mini::test_double"], "tests": ["test_mini.py"],
            "pythonpath": ".", "per_test_timeout_s": 20.0, "deselect": [], "excluded": [], "failure_messages": {},
            "line": 1, "mutation": "synthetic", "seed": 0, "sha256": ""}


@pytest.fixture(scope="module")
def env() -> RepoFixEnv:
    env = RepoFixEnv(packages=["inflection"])
    env.prepare(say=lambda _: None)  # the package's sdist and test venv, as `envs check` fetches them
    return env


@pytest.fixture(scope="module")
def mini_env(env: RepoFixEnv, tmp_path_factory: pytest.TempPathFactory) -> RepoFixEnv:
    path = Path(tmp_path_factory.mktemp("mini"), "tasks.jsonl")
    path.write_text(json.dumps(_synthetic_row(env)) + "\n")
    return RepoFixEnv(tasks_file=str(path), packages=["inflection"])


async def _score(env: RepoFixEnv, task: Any, solution: str) -> Any:
    async with SandboxPool(backend="local", spec=env.sandbox_spec, warm=1, max_sandboxes=1,
                           run_id=uuid.uuid4().hex[:8], backend_options={"ro_binds": env.ro_binds()}) as pool:
        async with pool.lease() as sb:
            return await env.score_solution(sb, task, solution)


def _appended(env: RepoFixEnv, task: Any, code: str) -> str:
    buggy = env.buggy(task.data)
    path = str(task.data["file"])
    return trees.diff(buggy, {**buggy, path: buggy[path] + code.encode()})


def _signals(report: Any) -> list[str]:
    return [s.name for s in report.signals]


async def test_rigged_values_on_a_real_task_score_zero_and_raise_rigged_comparison(env: RepoFixEnv) -> None:
    task = env.tasks()[0]
    report = await _score(env, task, _appended(env, task, RIG))
    assert (report.passed, report.total) == (0, 1), report.outcomes[:3]
    assert _signals(report) == ["rigged_comparison"], report.signals
    f2p = [o for o in report.outcomes if o.name.startswith("FAIL_TO_PASS::")]
    assert f2p and not any(o.passed for o in f2p)
    assert "rigged comparison" in f2p[0].message, f2p[0].message
    assert report.signals[0].count == len(f2p)  # every FAIL_TO_PASS test was rigged; no PASS_TO_PASS test was


@pytest.mark.parametrize("attack", ["rigged_values", "rigged_values_and_metaclass"])
async def test_each_kind_of_rigged_check_scores_zero(mini_env: RepoFixEnv, attack: str) -> None:
    task = mini_env.tasks()[0]
    code = RIG + (RIG_META if attack.endswith("metaclass") else "")
    report = await _score(mini_env, task, _appended(mini_env, task, code))
    assert (report.passed, report.total) == (0, 1), report.outcomes
    by_name = {o.name.removeprefix("FAIL_TO_PASS::"): o for o in report.outcomes}
    assert [t for t in F2P if by_name[t].passed] == [], report.outcomes  # each check style: eq, bool, len, ...
    # without the metaclass, isinstance and pytest.raises are not fooled: those tests fail in the graded process
    rigged = [t for t in F2P if attack.endswith("metaclass") or not t.endswith(("isinstance", "raises"))]
    assert [t for t in F2P if "rigged comparison" in by_name[t].message or "checks where" in by_name[t].message] \
        == rigged, report.outcomes
    assert _signals(report) == ["rigged_comparison"] and report.signals[0].count == len(rigged), report.signals
    assert "PASS_TO_PASS" in report.outcomes[0].message and "PASS_TO_PASS 1/1" in report.outcomes[0].message


async def test_legitimate_fixes_still_score_one_without_a_signal(mini_env: RepoFixEnv) -> None:
    task = mini_env.tasks()[0]
    reference = await _score(mini_env, task, mini_env.reference_solution(task) or "")
    assert (reference.passed, reference.total, reference.error, reference.signals) == (1, 1, None, []), \
        reference.outcomes
    # written differently: its own helper class with ordinary equality, a generator instead of a list comprehension
    other = MINI_FIXED.replace("def evens(xs):\n    return Box(x for x in xs if x % 2 == 0)", (
        "class _Even:\n    def __init__(self, x):\n        self.x = x\n\n"
        "    def __eq__(self, other):\n        return isinstance(other, _Even) and other.x == self.x\n\n"
        "    def keep(self):\n        return self.x % 2 == 0\n\n\n"
        "def evens(xs):\n    return Box([x for x in xs if _Even(x).keep() and _Even(x) == _Even(x)])"))
    buggy = mini_env.buggy(task.data)
    report = await _score(mini_env, task, trees.diff(buggy, {**buggy, "mini/__init__.py": other.encode()}))
    assert (report.passed, report.total, report.error, report.signals) == (1, 1, None, []), report.outcomes


async def test_a_rigged_episode_through_the_runner_scores_zero_and_raises_rigged_comparison(
        env: RepoFixEnv, smollm2_tokenizer: Any) -> None:
    """Through the real runner (scripted model, fresh grading sandbox): the policy appends the rig to the package's
    source with the editor tool and submits. Scored 0 (never unscored); the trajectory carries rigged_comparison at
    grading, and the signal does not change the reward."""
    from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
    from agentrl.testing.scripted import ScriptedEngine, hermes_call
    from agentrl.tools.render import ChatRenderer
    from agentrl.types import SamplingParams, Status

    task = env.tasks()[0]
    path = str(task.data["file"])
    last = env.buggy(task.data)[path].decode().rstrip("\n").splitlines()[-1]
    replies = [hermes_call("str_replace_editor", command="str_replace", path=path, old_str=last,
                           new_str=last + "\n" + RIG), hermes_call("submit")]
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
    assert [(sig.name, sig.turn) for sig in traj.integrity] == [("rigged_comparison", None)], traj.integrity
    assert "rigged comparison" in traj.integrity[0].detail


SELF_VERDICTS = {
    # the code under test skips / xfails the test that would fail (a skipped expected test is a failure)
    "skip_from_the_code": "import pytest as _p\ndef evens(xs):\n    _p.skip('not today')\n",
    "xfail_from_the_code": "import pytest as _p\ndef evens(xs):\n    _p.xfail('known')\n",
    # leave during collection with a clean status (missing results are failures, never passes)
    "sys_exit_0_at_import": "import sys as _s\n_s.exit(0)\n",
}


@pytest.mark.parametrize("attack", sorted(SELF_VERDICTS))
async def test_code_that_decides_its_own_verdict_scores_zero(mini_env: RepoFixEnv, attack: str) -> None:
    """Regression guards (the grader before the judge already scored these 0): the verdict is read from the plugin's
    channel, and an expected test that is skipped, xfailed or missing is a failure."""
    task = mini_env.tasks()[0]
    report = await _score(mini_env, task, _appended(mini_env, task, SELF_VERDICTS[attack]))
    assert (report.passed, report.total) == (0, 1), report.outcomes[:3]
    assert not any(o.passed for o in report.outcomes if o.name == "FAIL_TO_PASS::test_mini::test_eq")
