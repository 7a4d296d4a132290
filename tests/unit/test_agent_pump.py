"""ExecRun.pump, the agent's loop over a command's pipes and exit: when it returns, and why."""

from __future__ import annotations

import os
import time

from agentrl.sandbox.agent import process
from agentrl.sandbox.agent.identity import Identity
from agentrl.sandbox.agent.process import ExecRun, Proc


def _closed_pipes_proc(exits_after_polls: int) -> Proc:
    """A command whose pipes already hit EOF (its output was written and its ends closed) and whose exit its starter
    reports only on the `exits_after_polls`-th look: no pidfd, as when the reaper reaped it before the agent could
    open one (a fast command on a loaded machine)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    os.write(out_w, b"hi\n")
    os.close(out_w)
    os.close(err_w)
    looks = iter(range(exits_after_polls, 0, -1))
    return Proc(os.getpid(), stdout=out_r, stderr=err_r, exited=lambda: next(looks, 0) <= 1)


def test_a_command_whose_pipes_closed_before_its_exit_was_seen_returns_at_the_exit_not_after_the_grace(
        monkeypatch) -> None:
    monkeypatch.setattr(process, "open_pidfd", lambda pid: None)  # reaped already: no pidfd to open
    run = ExecRun(["true"], "/", {}, None, 1 << 20, Identity(None))
    proc = _closed_pipes_proc(exits_after_polls=3)
    t0 = time.monotonic()
    closed = run.pump(proc, deadline=t0 + 120, grace=60)
    elapsed = time.monotonic() - t0
    assert closed and bytes(run.out) == b"hi\n" and not run.timed_out
    assert elapsed < 30, f"pump waited {elapsed:.1f}s: the grace (60 s) though nothing held the pipes"
    proc.ended(0)


def test_a_command_whose_pipes_stay_open_after_its_exit_returns_after_the_grace(monkeypatch) -> None:
    monkeypatch.setattr(process, "open_pidfd", lambda pid: None)
    out_r, out_w = os.pipe()  # out_w stays open: a background child holding the command's stdout
    err_r, err_w = os.pipe()
    os.close(err_w)
    proc = Proc(os.getpid(), stdout=out_r, stderr=err_r, exited=lambda: True)
    run = ExecRun(["true"], "/", {}, None, 1 << 20, Identity(None))
    t0 = time.monotonic()
    try:
        assert run.pump(proc, deadline=t0 + 120, grace=0.3) is False  # the caller kills the group
        assert 0.3 <= time.monotonic() - t0 < 30 and not run.timed_out
    finally:
        os.close(out_w)
        proc.ended(0)
