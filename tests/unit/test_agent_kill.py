"""The in-sandbox agent's one killer (agentrl/sandbox/agent/kill.py), on real processes: single pids, process groups,
pidfds, every process of a uid (root only), the rounds of /kill_all; a target that is already gone is fine. And the
rule that makes it the one killer: no other module of the agent signals a process itself."""

from __future__ import annotations

import ast
import ctypes
import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.sandbox.agent import kill
from agentrl.sandbox.agent.protocol import KIND_SURVIVORS, HTTPError

AGENT_DIR = Path(kill.__file__).parent


def _gone(pid: int) -> bool:
    """No such process, or a zombie (killed, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def _wait_gone(pids: set[int], seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.01)
    return False


def _group_members(pgid: int) -> set[int]:
    out = set()
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if name.isdigit() and int(fields[2]) == pgid and fields[0] != "Z":
            out.add(int(name))
    return out


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _sleeper(procs: list[subprocess.Popen], *, session: bool = False, user: int | None = None) -> subprocess.Popen:
    p = subprocess.Popen(["sleep", "60"], start_new_session=session, user=user, group=user)
    procs.append(p)
    return p


def test_kill_pid_kills_and_tolerates_a_gone_process(procs: list[subprocess.Popen]) -> None:
    p = _sleeper(procs)
    kill.kill_pid(p.pid)
    assert p.wait(5) == -signal.SIGKILL
    kill.kill_pid(p.pid)  # reaped: ESRCH (or, reused meanwhile by another uid, EPERM), both ignored


@pytest.mark.parametrize("error", [ProcessLookupError, PermissionError])
def test_kill_pid_and_group_ignore_gone_and_foreign_targets(monkeypatch: pytest.MonkeyPatch,
                                                            error: type[OSError]) -> None:
    def refuse(*args: int) -> None:
        raise error()

    monkeypatch.setattr(os, "kill", refuse)
    monkeypatch.setattr(os, "killpg", refuse)
    kill.kill_pid(12345)
    kill.kill_group(12345)
    kill.kill_pids({1, 2, 3})


def test_other_errors_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ESRCH and EPERM are a target's own doing; anything else (EINVAL: a bad signal) is the agent's bug."""
    def invalid(*args: int) -> None:
        raise OSError(errno.EINVAL, "invalid")

    monkeypatch.setattr(os, "kill", invalid)
    monkeypatch.setattr(os, "killpg", invalid)
    with pytest.raises(OSError):
        kill.kill_pid(12345)
    with pytest.raises(OSError):
        kill.kill_group(12345)


def test_kill_pids_kills_each(procs: list[subprocess.Popen]) -> None:
    ps = [_sleeper(procs) for _ in range(3)]
    kill.kill_pids({p.pid for p in ps})
    assert [p.wait(5) for p in ps] == [-signal.SIGKILL] * 3


def test_kill_group_kills_the_leader_and_its_background_children(procs: list[subprocess.Popen]) -> None:
    """A command's process group: the leader (a session of its own) and what it put in the background."""
    leader = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & sleep 60 & echo started; wait"], start_new_session=True,
                              stdout=subprocess.PIPE)
    procs.append(leader)
    assert leader.stdout is not None and leader.stdout.readline() == b"started\n"
    members = _group_members(leader.pid)
    assert leader.pid in members and len(members) == 3, members
    kill.kill_group(leader.pid)
    assert leader.wait(5) == -signal.SIGKILL
    assert _wait_gone(members), {p for p in members if not _gone(p)}
    kill.kill_group(leader.pid)  # the group is gone: ignored


def test_kill_pidfd(procs: list[subprocess.Popen]) -> None:
    p = _sleeper(procs)
    os.kill(p.pid, signal.SIGSTOP)  # stopped (as a spawner the policy stopped): SIGKILL still ends it
    pidfd = os.pidfd_open(p.pid)
    try:
        kill.kill_pidfd(pidfd)
        assert p.wait(5) == -signal.SIGKILL
        kill.kill_pidfd(pidfd)  # reaped: ESRCH through the pidfd, ignored
    finally:
        os.close(pidfd)
    kill.kill_pidfd(pidfd)  # a closed descriptor (EBADF): ignored as well


def test_kill_until_gone_counts_distinct_kills_and_leaves_out_the_uncounted(procs: list[subprocess.Popen]) -> None:
    ps = [_sleeper(procs) for _ in range(4)]
    pids = {p.pid for p in ps}
    rounds = []

    def live() -> set[int]:
        return {pid for pid in pids if not _gone(pid)}

    def killer(found: set[int]) -> None:
        rounds.append(set(found))
        kill.kill_pids(found)

    killed = kill.kill_until_gone(live, killer, 5.0, {ps[0].pid}, "in the test")
    assert killed == 3 and rounds[0] == pids
    assert [p.wait(5) for p in ps] == [-signal.SIGKILL] * 4


def test_kill_until_gone_gives_up_with_409_on_survivors() -> None:
    with pytest.raises(HTTPError) as e:
        kill.kill_until_gone(lambda: {424242}, lambda found: None, 0.05, set(), "in the test")
    assert e.value.status == 409 and e.value.kind == KIND_SURVIVORS
    assert "1 process(es) in the test survived SIGKILL for 0.05s: [424242]" in e.value.message


def test_kill_until_gone_waits_until_settled() -> None:
    checks = iter([False, False, True])
    assert kill.kill_until_gone(set, lambda found: None, 5.0, set(), "x", settled=lambda: next(checks)) == 0
    assert next(checks, None) is None


def test_kill_all_deadline() -> None:
    assert kill.KILL_ALL_DEADLINE_S == 5.0


def _uid() -> int:
    return 60000 + (os.getpid() + 23) % 5000


def test_kill_all_as_refuses_without_root_or_for_root() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert kill.kill_all_as(libc, 0) is False  # never kill(-1) as root
    if os.geteuid() != 0:
        assert kill.kill_all_as(libc, _uid()) is False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (becomes another uid)")
def test_kill_all_as_kills_every_process_of_the_uid_only(procs: list[subprocess.Popen]) -> None:
    uid = _uid()
    victims = [_sleeper(procs, session=True, user=uid) for _ in range(3)]
    bystander = _sleeper(procs)  # root's: never touched
    libc = ctypes.CDLL(None, use_errno=True)
    assert kill.kill_all_as(libc, uid) is True
    assert [v.wait(5) for v in victims] == [-signal.SIGKILL] * 3
    assert bystander.poll() is None and os.geteuid() == 0 and os.getuid() == 0
    assert kill.kill_all_as(libc, uid) is True  # none of that uid left (ESRCH): fine


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (becomes another uid)")
def test_fork_kill_all_as(procs: list[subprocess.Popen]) -> None:
    uid = _uid() + 1
    victims = [_sleeper(procs, session=True, user=uid) for _ in range(2)]
    bystander = _sleeper(procs)
    child = kill.fork_kill_all_as(uid, uid)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    assert [v.wait(5) for v in victims] == [-signal.SIGKILL] * 2
    assert bystander.poll() is None


SIGNALLING = {("os", "kill"), ("os", "killpg"), ("signal", "pidfd_send_signal"), ("signal", "pthread_kill")}


def test_no_other_agent_module_signals_a_process() -> None:
    """kill.py is the one killer: no other module of the agent calls os.kill, os.killpg or pidfd_send_signal (the
    two program modules, run standalone, import only builtins and signal nothing)."""
    offenders = []
    for path in sorted(AGENT_DIR.glob("*.py")):
        if path.name == "kill.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    (node.value.id.lstrip("_"), node.attr) in SIGNALLING:
                offenders.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in ("os", "signal") and \
                    any((node.module, a.name) in SIGNALLING for a in node.names):
                offenders.append(f"{path.name}:{node.lineno} from {node.module} import")
    assert offenders == [], offenders
