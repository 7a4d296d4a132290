"""repo_fix through real local (bubblewrap) sandboxes: grading (reference 1.0, no-op 0, test-only patch 0 with the
dropped paths recorded, identical on a second run), the tools as the model is told, and a scripted multi-turn
episode (view, grep, edit, run tests, submit) through the real runner that earns reward 1.0.

Uses the committed task file (inflection tasks only: its suite runs in ~2 s) and the package cache; the cache is
filled on first use (`python -m agentrl_repo_fix prepare`: one hash-checked sdist download + a venv), then offline.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from typing import Any

import pytest
from agentrl_repo_fix import RepoFixEnv

from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
from agentrl.sandbox import SandboxPool
from agentrl.testing.scripted import ScriptedEngine, hermes_call, single_hunk_edit
from agentrl.tools.render import ChatRenderer
from agentrl.types import SamplingParams, Status, ToolCall

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
PACKAGE = "inflection"


@pytest.fixture(scope="module")
def env() -> RepoFixEnv:
    env = RepoFixEnv(packages=[PACKAGE])
    env.prepare(say=lambda _: None)  # the package's sdist and test venv, as `envs check` fetches them
    return env


def _pool(env: RepoFixEnv, n: int = 1) -> SandboxPool:
    return SandboxPool(backend="local", spec=env.sandbox_spec, warm=n,
                       max_sandboxes=n, run_id=uuid.uuid4().hex[:8], backend_options={"ro_binds": env.ro_binds()})


async def _score(env: RepoFixEnv, task: Any, solution: str) -> Any:
    async with _pool(env) as pool, pool.lease() as sb:
        return await env.score_solution(sb, task, solution)


def _summary(report: Any) -> tuple[int, int, list[tuple[str, bool]]]:
    return report.passed, report.total, [(o.name, o.passed) for o in report.outcomes]


async def test_reference_passes_noop_and_test_only_fail_and_grading_repeats(env: RepoFixEnv) -> None:
    tasks = env.tasks()[:3]  # every task is checked by `agentrl envs check repo_fix` (BENCHMARKS.md); 3 here
    assert tasks
    for task in tasks:
        ref = await _score(env, task, env.reference_solution(task) or "")
        assert (ref.passed, ref.total, ref.error) == (1, 1, None), ref.outcomes[:3]
        assert "FAIL_TO_PASS" in ref.outcomes[0].message
    task = tasks[0]
    noop = await _score(env, task, "")
    assert (noop.passed, noop.total) == (0, 1)
    assert any(o.name.startswith("FAIL_TO_PASS::") and not o.passed for o in noop.outcomes)
    # a test-only patch: empty the test file (every test would "pass" vacuously if it were kept)
    test_file = task.data["tests"][0]
    original = env.buggy(task.data)[test_file].decode()
    lines = original.splitlines()
    test_only = (f"diff --git a/{test_file} b/{test_file}\n--- a/{test_file}\n+++ b/{test_file}\n"
                 f"@@ -1,{len(lines)} +1,1 @@\n" + "".join(f"-{ln}\n" for ln in lines) + "+x = 1\n")
    cheat = await _score(env, task, test_only)
    assert (cheat.passed, cheat.total) == (0, 1)
    assert f"dropped changes: {test_file} (test file)" in cheat.outcomes[0].message
    again = await _score(env, task, env.reference_solution(task) or "")
    first = await _score(env, task, env.reference_solution(task) or "")
    assert _summary(again) == _summary(first)


async def test_tools_behave_as_described(env: RepoFixEnv) -> None:
    task = env.tasks()[0]
    src_file = task.data["file"]

    def call(name: str, **args: Any) -> ToolCall:
        return ToolCall(id=uuid.uuid4().hex[:6], name=name, arguments=args)

    async with _pool(env) as pool, pool.lease() as sb:
        await env.setup(sb, task)
        r = await env.call_tool(sb, call("bash", command="git log --oneline | wc -l; git status --porcelain | wc -l; "
                                         f"find / -path '*/{src_file}' -type f -exec sha256sum {{}} + 2>/dev/null"),
                                task=task)
        count, dirty, *found = r.output.split()
        assert (count, dirty) == ("1", "0"), r.output
        copies = dict(zip(found[1::2], found[0::2]))  # path -> sha256 of every file named like the buggy one
        pristine = hashlib.sha256(env.pristine(task.data)[src_file]).hexdigest()
        buggy = hashlib.sha256(env.buggy(task.data)[src_file]).hexdigest()
        assert copies[f"/repo/{src_file}"] == buggy and pristine not in copies.values(), copies
        await env.call_tool(sb, call("bash", command="cd inflection && export FOO=bar"), task=task)
        r = await env.call_tool(sb, call("bash", command="pwd; echo $FOO; command -v python"), task=task)
        assert r.output.split()[:2] == ["/repo/inflection", "bar"], r.output
        assert r.output.split()[2].endswith("/bin/python") and "venvs" in r.output
        r = await env.call_tool(sb, call("bash", command="seq 1 100000"), task=task)
        assert r.truncated and r.output.startswith("1\n") and r.output.rstrip().endswith("100000")
        assert "bytes cut" in r.output and len(r.output) <= env.config.output_chars
        quick = RepoFixEnv(packages=[PACKAGE], bash_timeout_s=2)
        r = await quick.call_tool(sb, call("bash", command="echo started; sleep 20"), task=task)
        assert r.timed_out and "timed out after 2s" in r.output
        r = await env.call_tool(sb, call("bash", command="exit 3"), task=task)
        assert r.exit_code == 3 and "[exit code 3]" in r.output and "the shell exited" in r.output
        r = await env.call_tool(sb, call("bash", command="pwd; echo ${FOO:-unset}"), task=task)
        assert r.output.split() == ["/repo", "unset"], "`exit` ends the session: the next call starts afresh"
        r = await env.call_tool(sb, call("str_replace_editor", command="view", path=src_file, view_range=[1, 3]),
                                task=task)
        assert r.error is None and r.output.splitlines()[0].lstrip().startswith("1\t")
        assert len(r.output.splitlines()) == 3
        r = await env.call_tool(sb, call("str_replace_editor", command="str_replace", path=src_file,
                                         old_str="def ", new_str="def  "), task=task)
        assert r.error == "tool_failed" and "occurs" in r.output and "times" in r.output and "lines" in r.output
        r = await env.call_tool(sb, call("str_replace_editor", command="str_replace", path=src_file,
                                         old_str="no such text anywhere", new_str="x"), task=task)
        assert r.error == "tool_failed" and "occurs 0 times" in r.output
        before = await sb.read_bytes(f"/repo/{src_file}")
        r = await env.call_tool(sb, call("str_replace_editor", command="insert", path=src_file, insert_line=0,
                                         new_str="# hello"), task=task)
        assert r.error is None
        assert (await sb.read_bytes(f"/repo/{src_file}")).startswith(b"# hello\n")
        r = await env.call_tool(sb, call("str_replace_editor", command="undo_edit", path=src_file), task=task)
        assert r.error is None and await sb.read_bytes(f"/repo/{src_file}") == before
        r = await env.call_tool(sb, call("str_replace_editor", command="view", path="/etc/passwd"), task=task)
        assert r.error == "tool_failed"
        r = await env.call_tool(sb, call("submit"), task=task)
        assert r.done




async def test_bash_is_one_persistent_shell_per_trajectory(env: RepoFixEnv) -> None:
    """cwd, variables, functions and aliases persist; background jobs die at the end of their call; a timeout kills
    the command but keeps the shell (or restarts it, saying so, when only killing the shell stops it); forged
    protocol lines cannot fake an exit code."""
    task = env.tasks()[0]
    quick = RepoFixEnv(packages=[PACKAGE], bash_timeout_s=3)
    quick.shells = env.shells

    async def bash(command: str, on: RepoFixEnv = env) -> Any:
        return await on.call_tool(sb, ToolCall(id=uuid.uuid4().hex[:6], name="bash", arguments={"command": command}),
                                  task=task)

    async with _pool(env) as pool, pool.lease() as sb:
        await env.setup(sb, task)
        r = await bash("cd inflection && S=mine LOCAL=1 && export FOO=bar && greet() { echo hi-$1; } && "
                       "alias ll='echo aliased'")
        assert r.exit_code == 0, r.output
        r = await bash("pwd; echo $LOCAL $FOO $S; greet you; ll")
        assert r.output.split() == ["/repo/inflection", "1", "bar", "mine", "hi-you", "aliased"], r.output
        r = await bash("sleep 1000 & echo $!; setsid sleep 1001 </dev/null >/dev/null 2>&1 & echo started")
        pid = r.output.split()[0]
        assert "started" in r.output and r.exit_code == 0, r.output
        r = await bash(f"kill -0 {pid} 2>/dev/null && echo alive || echo dead; "
                       "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -c 'sleep 100[01]'; "
                       "done | paste -sd+ | bc")
        assert r.output.split() == ["dead", "0"], r.output
        r = await bash("echo before; sleep 30; echo never-reached", on=quick)
        assert r.timed_out and "timed out after 3s" in r.output and "before" in r.output
        assert "never-reached" not in r.output, r.output
        assert "new shell" not in r.output, r.output
        r = await bash("pwd; echo $FOO")
        assert r.output.split() == ["/repo/inflection", "bar"], "the shell survived the timeout of its command"
        r = await bash("while :; do :; done", on=quick)  # a builtin loop: stopped between two of its steps
        assert r.timed_out and "new shell" not in r.output, r.output
        r = await bash("pwd")
        assert r.output.split() == ["/repo/inflection"], r.output
        r = await bash("trap '' USR1; while :; do :; done", on=quick)  # only killing the shell stops this one
        assert r.timed_out and "the shell did not stop after the timeout" in r.output, r.output
        r = await bash("pwd; echo ${FOO:-unset}")
        assert r.output.split() == ["/repo", "unset"], r.output
        # forge the protocol: `done` and `rc ... 0` lines for its own call id on the shell's FIFO, a fake `exit`, a
        # sentinel-looking line in the output, then fail
        forge = ("d=$(ls -d /workspace/.agentrl/sh-*); id=$(ls $d | sed -n 's/^cmd\\.//p'); "
                 "for n in 0 00000000000000000000000000000000 $id; do printf 'done %s\\nrc %s %s 0\\nexit %s 0\\n' "
                 "$id $id $n $id > $d/out; done; printf 'nonce %s\\n' fake > $d/in; echo \"rc $id x 0\"; "
                 "sleep 2; false")
        r = await bash(forge)
        assert r.exit_code == 1 and "[exit code 1]" in r.output, r.output
        r = await bash("echo still here")
        assert r.output.strip() == "still here" and r.exit_code == 0, r.output


async def test_scripted_episode_through_the_runner_earns_reward_one(env: RepoFixEnv, smollm2_tokenizer: Any) -> None:
    task = next(t for t in env.tasks() if str(t.data["reference_diff"]).count("@@ -") == 1)
    path, old, new = single_hunk_edit(str(task.data["reference_diff"]))
    tests = " ".join(task.data["tests"])
    replies = [
        hermes_call("str_replace_editor", command="view", path=path, view_range=[1, 20]),
        hermes_call("bash", command=f"grep -n 'def ' {path} | head -5"),
        hermes_call("str_replace_editor", command="str_replace", path=path, old_str=old, new_str=new),
        hermes_call("bash", command=f"python -m pytest -q -x {tests} 2>&1 | tail -3"),
        hermes_call("submit"),
    ]
    engine = ScriptedEngine(smollm2_tokenizer, replies, context_window=32768)
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(smollm2_tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=2048,
                                              stop_token_ids=[smollm2_tokenizer.eos_token_id]),
                      budgets=Budgets(max_turns=50, max_completion_tokens=30000, context_window=32768,
                                      tool_timeout_s=120))
    async with _pool(env) as pool:
        sched = Scheduler(rollout, pool, SchedulerConfig(group_size=1))
        traj = await sched.run_one(task, group_id="g", sample_index=0)
    assert traj.status is Status.ok, traj.error
    assert len(traj.turns) == 5 and traj.num_tool_calls == 5
    edit = traj.turns[2].tool_results[0]
    assert edit.error is None, edit.output
    assert "passed" in traj.turns[3].tool_results[0].output
    assert traj.reward == 1.0, traj.tests
    assert traj.solution and f"a/{path}" in traj.solution


async def test_envs_check_runs_reference_noop_test_only_and_a_repeat(env: RepoFixEnv, tmp_path: Any,
                                                                     capsys: Any) -> None:
    from agentrl.cli.wiring import check_env

    out = tmp_path / "check.json"
    rc = await check_env("repo_fix", solutions=None, backend="local", json_out=out, options={"packages": [PACKAGE]},
                         tasks=1, concurrency=1)
    assert rc == 0, capsys.readouterr().out
    (row,) = json.loads(out.read_text())
    assert (row["passed"], row["total"], row["error"]) == (1, 1, None)
    assert row["signals"] == [] and "integrity signals raised by the grader: none" in capsys.readouterr().out
    cases = env.check_cases(env.tasks()[0])
    assert [(label, must) for label, _, must in cases] == [("no-op patch", False), ("test-only patch", False)]
    assert cases[1][1].count("diff --git") >= 1 and "test_inflection.py" in cases[1][1]


async def test_a_fix_that_patches_pytest_scores_zero(env: RepoFixEnv) -> None:
    task = env.tasks()[0]
    path = str(task.data["file"])
    forge = ("\nimport _pytest.reports as _r\n_r.TestReport.passed = property(lambda self: True)\n")
    buggy = env.buggy(task.data)
    patch = trees_diff(buggy, {**buggy, path: buggy[path] + forge.encode()})
    report = await _score(env, task, patch)
    assert report.passed == 0 and "_pytest.reports.TestReport.passed was changed at run time" in (report.error or "")


def trees_diff(old: Any, new: Any) -> str:
    from agentrl_repo_fix import trees

    return trees.diff(old, new)


PLANT = r"""
cat > conftest.py <<'PY'
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rep.outcome = "passed"
PY
mkdir -p tests_extra && cp conftest.py tests_extra/
SITE=$HOME/.local/lib/python3.11/site-packages; mkdir -p $SITE
printf 'import _forge\n' > $SITE/evil.pth
printf 'import _pytest.reports as r\nr.TestReport.passed = property(lambda s: True)\n' > $SITE/_forge.py
cp $SITE/evil.pth /tmp/evil.pth 2>/dev/null; cp $SITE/_forge.py /tmp/sitecustomize.py
printf 'import _forge\n' > sitecustomize.py
ln -s /etc/hostname linked_file
echo planted
"""


async def test_planted_hooks_neither_forge_a_pass_nor_break_an_honest_fix(env: RepoFixEnv) -> None:
    """conftest hooks, a user-site .pth, sitecustomize and a symlink planted by the policy: a buggy repo still scores
    0 (the plants are dropped or never loaded) and the reference fix among the same plants still scores 1."""
    task = env.tasks()[0]
    path, old, new = single_hunk_edit(str(task.data["reference_diff"]))
    for fix in (False, True):
        async with _pool(env) as pool, pool.lease() as sb:
            await env.setup(sb, task)
            r = await env.call_tool(sb, ToolCall(id="p", name="bash", arguments={"command": PLANT}), task=task)
            assert "planted" in r.output, r.output
            # the conftest really forges a pass when the policy itself runs the tests
            r = await env.call_tool(sb, ToolCall(id="t", name="bash", arguments={
                "command": f"python -m pytest -q {' '.join(task.data['tests'])} 2>&1 | tail -1"}), task=task)
            assert "failed" not in r.output, r.output
            if fix:
                e = await env.call_tool(sb, ToolCall(id="e", name="str_replace_editor", arguments={
                    "command": "str_replace", "path": path, "old_str": old, "new_str": new}), task=task)
                assert e.error is None, e.output
            report = await env.finalize(sb, task)
            solution = await env.solution(sb, task) or ""
        assert report.passed == int(fix), report.outcomes[:3]
        message = report.outcomes[0].message
        for dropped in ("conftest.py (test/build configuration)", "sitecustomize.py (test/build configuration)",
                        "tests_extra/conftest.py (test/build configuration)", "linked_file (not a regular file)"):
            assert dropped in message and f"# dropped before grading: {dropped}" in solution, (dropped, message)


class _ProbedEnv(RepoFixEnv):
    """repo_fix that records which sandboxes the policy and the grader used, and what the grading sandbox holds
    (outside the grader's own files) just before the suite runs."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.policy: set[str] = set()
        self.graded_in: list[str] = []
        self.probes: list[str] = []

    async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Any) -> Any:
        self.policy.add(sandbox.id)
        return await super().call_tool(sandbox, call, task=task)

    async def grade(self, sandbox: Any, task: Any, submission: Any) -> Any:
        self.graded_in.append(sandbox.id)
        probe = await sandbox.exec(["sh", "-c", "find /workspace /tmp /repo -mindepth 1; s=sle; s=${s}ep; "
                                    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
                                    "grep \"$s 1000\"; done; true"], timeout=20)
        self.probes.append(probe.stdout)
        return await super().grade(sandbox, task, submission)


async def test_what_the_policy_leaves_outside_repo_is_absent_where_grading_runs(env: RepoFixEnv,
                                                                                 smollm2_tokenizer: Any) -> None:
    """Through the real runner: the policy plants a user-site .pth, sitecustomize in /tmp and the workspace, a conftest
    and a background process, then fixes the bug. Grading runs in another sandbox that holds none of it (the workspace,
    /tmp and /repo are empty, no process of the policy), and the fix still earns 1.0."""
    probed = _ProbedEnv(packages=[PACKAGE])
    task = next(t for t in probed.tasks() if str(t.data["reference_diff"]).count("@@ -") == 1)
    path, old, new = single_hunk_edit(str(task.data["reference_diff"]))
    plant = PLANT + "setsid sleep 1000 </dev/null >/dev/null 2>&1 &\necho extra > /workspace/notes.txt\n"
    replies = [hermes_call("bash", command=plant),
               hermes_call("str_replace_editor", command="str_replace", path=path, old_str=old, new_str=new),
               hermes_call("bash", command="ls -A /tmp /workspace | head; ls ~/.local/lib/python3.11/site-packages"),
               hermes_call("submit")]
    engine = ScriptedEngine(smollm2_tokenizer, replies, context_window=32768)
    rollout = Rollout(env=probed, engine=engine, renderer=ChatRenderer(smollm2_tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=2048,
                                              stop_token_ids=[smollm2_tokenizer.eos_token_id]),
                      budgets=Budgets(max_turns=10, max_completion_tokens=30000, context_window=32768,
                                      tool_timeout_s=120))
    async with _pool(probed) as pool:
        traj = await Scheduler(rollout, pool, SchedulerConfig(group_size=1)).run_one(task, group_id="g",
                                                                                     sample_index=0)
    assert traj.status is Status.ok and traj.reward == 1.0, (traj.status, traj.error, traj.tests)
    seen = traj.turns[2].tool_results[0].output
    assert "evil.pth" in seen and "notes.txt" in seen, f"the plants exist in the policy's sandbox: {seen}"
    (policy,) = probed.policy
    assert probed.graded_in and probed.graded_in[0] != policy, "graded in a sandbox of its own"
    assert probed.probes == [""], f"the policy's leftovers reached the grading sandbox: {probed.probes}"
    assert traj.solution and "# dropped before grading: conftest.py" in traj.solution
    # the dropped plants are an integrity signal at grading; detection never changed the reward above
    assert [(sig.name, sig.turn) for sig in traj.integrity] == [("protected_path_edit", None)], traj.integrity
    assert "conftest.py (test/build configuration)" in traj.integrity[0].detail
