"""Graders are non-dumpable from their first instruction: started through `scoring.judge_argv` (the sandbox's
execute-only interpreter, `Sandbox.judge_python`), a judge's /proc/<pid>/mem cannot be opened by a same-uid process
that was already waiting for it, even while the judge has run no statement of its own; the same program on plain
python3 (the old judge command, and the fallback) is open to that process for as long as it has not turned itself
non-dumpable. Real local (bubblewrap) sandbox, commands under uid separation."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agentrl_code_tests import scoring

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.client import Sandbox
from agentrl.sandbox.local import LocalBackend
from agentrl.testing.sandbox_attacks import SLEEP_FIRST, open_at_start
from local_sandbox_support import root_bwrap_problem, state_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(root_bwrap_problem() is not None, reason=str(root_bwrap_problem()))


@pytest.fixture
async def sandbox(state_dir: Path) -> AsyncIterator[Sandbox]:  # noqa: F811
    async with SandboxPool(LocalBackend(state_dir=state_dir), SandboxSpec(default_timeout_s=30), max_sandboxes=1,
                           run_id=uuid.uuid4().hex[:8]) as pool:
        async with pool.lease() as sb:
            yield sb


async def test_a_judge_is_out_of_reach_from_its_first_instruction(sandbox: Sandbox) -> None:
    """A daemon waiting for the judge (WATCH_START) opens /proc/<pid>/mem the moment the process appears; the
    judge's stand-in sleeps first, so only the command that started it decides."""
    assert sandbox.uid_separated and sandbox.judge_python == "/.agentrl/judge-python"
    judged = await open_at_start(sandbox, scoring.judge_argv(sandbox, SLEEP_FIRST))
    assert judged == "Permission denied 0", judged  # refused, and /proc/<pid>/mem is root's: non-dumpable
    # the control, same daemon: the old judge command (python3), which a sandbox without the copy falls back to
    plain = await open_at_start(sandbox, ["python3", "-I", "-c", SLEEP_FIRST])
    assert plain == f"opened {sandbox.command_uid}", plain
    sandbox.agent_info["judge_python"] = None
    assert scoring.judge_argv(sandbox, SLEEP_FIRST)[0] == "python3"


async def test_the_copy_cannot_be_read_and_is_the_same_python(sandbox: Sandbox) -> None:
    judge = sandbox.judge_python
    assert judge is not None
    res = await sandbox.exec(["cat", judge])
    assert res.exit_code != 0 and "Permission denied" in res.stderr
    show = "import sys; print(sys.version, sys.prefix, sys.path)"
    for flags in (["-I"], ["-I", "-S"]):
        copy, plain = [(await sandbox.exec([py, *flags, "-c", show])).stdout for py in (judge, "python3")]
        assert copy == plain != ""


async def test_the_harness_says_it_was_non_dumpable_from_exec_and_the_fallback_warns(
        sandbox: Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    data = {"prelude": "", "setup": "", "entry_point": "f"}
    spec = scoring.harness_spec(data, "def f():\n    return 1\n", [("t", "assert candidate() == 1")],
                                timeout_s=5, budget_s=10, nonce="n0")

    async def judged() -> bool:
        res = await sandbox.exec(scoring.judge_argv(sandbox, scoring.harness_source()), stdin=spec, timeout=30)
        line = json.loads(res.stdout.strip().split("\n")[-1][len(scoring.RESULT_MARK + "n0 "):])
        assert line["results"] == [["t", True, ""]], res
        return line["nondumpable_from_exec"]

    assert await judged() is True
    sandbox.agent_info["judge_python"] = None  # as a user image without the copy
    assert await judged() is False
    scoring._warned.clear()
    with caplog.at_level(logging.WARNING, logger="agentrl.envs.code_tests"):
        report = await scoring.run_harness(sandbox, data, "def f():\n    return 1\n", [("t", "assert f() == 1")],
                                           timeout_s=5, budget_s=10)
    assert report.passed == 1
    assert "no execute-only interpreter" in caplog.text
