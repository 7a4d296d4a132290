"""The separated cgroup layout of local sandboxes (limits.py) and the agent's side of it (CommandCgroup), on a
directory tree that stands in for a cgroup hierarchy: which files get which limits, where bubblewrap is launched,
and how a command joins `commands` under cgroup v2 (a host without v2 controllers cannot run that for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.sandbox import limits
from agentrl.sandbox.agent.cgroups import CommandCgroup
from agentrl.sandbox.base import SandboxSpec

SPEC = SandboxSpec(memory="256m", pids=64, cpus=0.5)


def _v2_parent(tmp_path: Path) -> Path:
    parent = tmp_path / "agentrl"
    parent.mkdir()
    return parent


class _FakeV2Sandbox:
    """mkdir in cgroupfs creates the interface files: the stand-in creates what `_separate` reads."""

    @staticmethod
    def prepare(parent: Path, sid: str, monkeypatch: pytest.MonkeyPatch) -> limits.LimitPlan:
        real_mkdir = limits.os.mkdir

        def mkdir(path: str, *a: object) -> None:
            real_mkdir(path, *a)
            Path(path, "cgroup.controllers").write_text("cpu memory pids\n")
            for name in ("cgroup.subtree_control", "cgroup.procs", "pids.max", "cpu.max", "memory.swap.max"):
                Path(path, name).write_text("")

        monkeypatch.setattr(limits.os, "mkdir", mkdir)
        return limits.Limiter("cgroup2", (str(parent),)).prepare(sid, SPEC, separate=True)


def test_separated_v2_puts_the_limits_on_commands_and_launches_into_agent(tmp_path: Path, monkeypatch) -> None:
    parent = _v2_parent(tmp_path)
    plan = _FakeV2Sandbox.prepare(parent, "sb1", monkeypatch)
    sandbox = parent / "sb1"
    assert plan.separated and plan.cgroups == (str(sandbox),)
    assert plan.launch_cgroups == (str(sandbox / "agent"),)
    assert plan.command_cgroups == (str(sandbox / "commands"),)
    assert (sandbox / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    commands = sandbox / "commands"
    assert (commands / "memory.max").read_text() == str(SPEC.memory_bytes)
    assert (commands / "memory.swap.max").read_text() == "0"
    assert (commands / "pids.max").read_text() == "64"
    assert (commands / "cpu.max").read_text() == "50000 100000"
    agent = sandbox / "agent"
    assert (agent / "pids.max").read_text() == str(limits.AGENT_PIDS)
    assert not (agent / "memory.max").exists() and (agent / "cpu.max").read_text() == ""  # no memory / CPU limit
    argv = plan.wrap(["bwrap", "--", "agent"])
    assert argv[:4] == ["/bin/sh", "-c", limits._JOIN, "sh"] and argv[4] == f"{sandbox}/agent/cgroup.procs"


def test_unseparated_plan_launches_into_the_limited_cgroup(tmp_path: Path) -> None:
    plan = limits.LimitPlan("cgroup1", ("/cg/pids/agentrl/x", "/cg/memory/agentrl/x"))
    assert not plan.separated and plan.launch_cgroups == plan.command_cgroups == plan.cgroups
    assert limits.Limiter("rlimit").can_separate is False


def test_removal_walks_the_children_first(tmp_path: Path) -> None:
    top = tmp_path / "sb"
    (top / "agent").mkdir(parents=True)
    (top / "commands").mkdir()
    tree = limits._tree(str(top))
    assert sorted(tree[:2]) == [str(top / "agent"), str(top / "commands")] and tree[2:] == [str(top)]
    limits.remove_cgroups([str(top)], deadline_s=0.1)
    assert not top.exists()


def test_v2_commands_join_through_a_shell_before_the_uid_switch(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "commands").mkdir()
    cg = CommandCgroup(f"v2:{tmp_path}")
    assert cg.enabled
    argv = cg.wrap(["/usr/bin/setpriv", "--reuid=1000", "--", "true"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3] == f"{tmp_path}/commands/cgroup.procs"
    assert argv[4:] == ["/usr/bin/setpriv", "--reuid=1000", "--", "true"]
    assert cg.start(lambda: "spawned") == "spawned"  # v2 moves nothing in the agent


def test_v1_spawning_thread_joins_commands_and_returns(tmp_path: Path) -> None:
    dirs = []
    for ctrl in ("pids", "memory"):
        for child in ("agent", "commands"):
            (tmp_path / ctrl / child).mkdir(parents=True)
        dirs.append(str(tmp_path / ctrl))
    cg = CommandCgroup("v1:" + ":".join(dirs))
    seen = {}

    def start() -> str:
        seen.update({d: Path(d, "commands", "tasks").read_text() for d in dirs})
        return "spawned"

    assert cg.start(start) == "spawned"
    assert seen == {d: "0" for d in dirs}  # this thread ("0") in commands during the fork
    assert all(Path(d, "agent", "tasks").read_text() == "0" for d in dirs)  # back in agent after it


@pytest.mark.parametrize("spec", ["v3:/x", "v1:", "v2:/a:/b", "/x"])
def test_bad_cgroups_option_exits_with_the_usage(spec: str) -> None:
    with pytest.raises(SystemExit, match="--cgroups"):
        CommandCgroup(spec)


def test_missing_children_exit_naming_the_directory(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no agent/ and commands/"):
        CommandCgroup(f"v1:{tmp_path}")


class _Exited:
    def __init__(self, returncode: int) -> None:
        self.returncode = returncode

    async def wait(self) -> int:
        return self.returncode


@pytest.mark.parametrize("separated, code, oom_in, cause", [
    (False, -9, "sandbox", "oom"),  # bubblewrap OOM-killed inside the cgroup it shares with the commands
    (False, -9, None, "killed:9"),  # bubblewrap killed from the host
    (False, 128 + 9, "sandbox", "oom"),  # the agent OOM-killed in the shared cgroup
    (True, -9, "commands", "killed:9"),  # separated: the commands' OOM kills cannot have been bubblewrap
    (True, 128 + 9, "agent", "killed:oom"),  # the OOM killer took the agent in its own cgroup: not the commands'
    (True, 128 + 9, "commands", "signal:9"),  # the commands' OOM kills say nothing about the agent's SIGKILL
    # no readable OOM counter where the agent lives: a SIGKILL proves nothing (never an outside cause by default)
    (True, 128 + 9, "unknown", "sigkill_unproven"),
    (False, 128 + 9, "unknown", "sigkill_unproven"),
    (False, -9, "unknown", "sigkill_unproven"),
    (True, -9, "unknown", "killed:9"),  # separated: bubblewrap is not in the commands' cgroup, their memory cannot
])
async def test_death_cause_tells_whose_memory_ran_out(tmp_path: Path, monkeypatch, separated: bool, code: int,
                                                      oom_in: str | None, cause: str) -> None:
    from agentrl.sandbox.base import AgentEndpoint, SandboxHandle
    from agentrl.sandbox.local import LocalBackend, _Live

    backend = LocalBackend(state_dir=tmp_path, unsafe_no_isolation=True)
    (tmp_path / "sb").mkdir()
    top = "/cg/memory/agentrl/sb"
    plan = limits.LimitPlan("cgroup1", (top,), separated=separated)
    backend._live["sb"] = _Live(_Exited(code), tmp_path / "sb", plan)  # type: ignore[arg-type]
    where = {"sandbox": top, "agent": f"{top}/agent", "commands": f"{top}/commands", None: "", "unknown": ""}[oom_in]
    monkeypatch.setattr(limits, "oom_kills_known",
                        lambda cgroups: None if oom_in == "unknown" else int(where in cgroups))
    handle = SandboxHandle(id="sb", backend="local", endpoint=AgentEndpoint(kind="unix", address="x"))
    assert await backend.death_cause(handle) == cause
