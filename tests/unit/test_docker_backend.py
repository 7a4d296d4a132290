"""The docker backend's pure parts, without a Docker Engine: the sweep rule wired to its labels (which containers are
orphans; the rule itself is tested in test_ownership.py), the container configuration a SandboxSpec turns into
(limits and hardening, `docker/specs.py`) and the separation layout (`docker/separation.py`). The real containers
are in tests/docker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.sandbox.docker import separation as layouts  # the package imports without the Docker SDK
from agentrl.sandbox.docker.specs import L_RUN, HostSide, container_config, sandbox_labels

docker = pytest.importorskip("docker")

from agentrl.sandbox import SandboxHandle, SandboxSpec
from agentrl.sandbox.base import AgentEndpoint
from agentrl.sandbox.docker import should_remove
from agentrl.sandbox.ownership import OwnerRecord, process_start

HOST = "this-host"
NOW = 1_000_000.0


def _labels(**over: str) -> dict[str, str]:
    base = {"agentrl.owner": "agentrl", "agentrl.run_id": "r1", "agentrl.owner_host": HOST,
            "agentrl.owner_pid": str(os.getpid()), "agentrl.owner_start": str(process_start(os.getpid()) or ""),
            "agentrl.created_at": str(NOW - 10), "agentrl.ttl_s": "3600"}
    return {**base, **over}


def _rule(labels: dict[str, str], run_id: str | None = None, all_runs: bool = False) -> bool:
    return should_remove(labels, now=NOW, host=HOST, run_id=run_id, all_runs=all_runs)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_owner_within_its_ttl_is_kept() -> None:
    assert not _rule(_labels())


def test_ttl_passed_is_removed_even_with_a_live_owner() -> None:
    assert _rule(_labels(**{"agentrl.created_at": str(NOW - 3601)}))


def test_dead_owner_on_this_host_is_removed() -> None:
    assert _rule(_labels(**{"agentrl.owner_pid": str(_dead_pid())}))


def test_a_reused_pid_is_not_mistaken_for_the_owner() -> None:
    assert _rule(_labels(**{"agentrl.owner_start": "1"}))  # same pid, different start time: another process


def test_owners_on_other_hosts_are_judged_only_by_ttl() -> None:
    other = {"agentrl.owner_host": "elsewhere", "agentrl.owner_pid": str(_dead_pid())}
    assert not _rule(_labels(**other))
    assert _rule(_labels(**other, **{"agentrl.created_at": str(NOW - 4000)}))


def test_run_id_selects_exactly_that_run_and_all_runs_everything() -> None:
    assert _rule(_labels(), run_id="r1")
    assert not _rule(_labels(**{"agentrl.created_at": str(NOW - 4000)}), run_id="r2")
    assert _rule(_labels(), all_runs=True)


def test_containers_not_made_by_agentrl_are_never_touched() -> None:
    foreign = _labels(**{"agentrl.owner": "someone-else", "agentrl.created_at": "0"})
    assert not _rule(foreign) and not _rule(foreign, all_runs=True) and not _rule(foreign, run_id="r1")
    assert not _rule({})


def test_malformed_labels_do_not_crash_or_remove() -> None:
    assert not _rule(_labels(**{"agentrl.created_at": "yesterday", "agentrl.owner_pid": "x"}))


def test_the_run_id_label_comes_from_the_callers_labels() -> None:
    owner = OwnerRecord.here()
    for caller in ({"agentrl/run-id": "r7"}, {"run_id": "r7", "other": "x"}, {"agentrl.run_id": "r7", "run_id": "r8"}):
        labels = sandbox_labels(SandboxSpec(ttl_s=60), caller, Path("/s/agentrl-x"), owner, NOW)
        assert labels[L_RUN] == "r7" and labels["agentrl.ttl_s"] == "60" and labels["agentrl.owner"] == "agentrl"
    assert sandbox_labels(SandboxSpec(), {}, Path("/s/agentrl-x"), owner, NOW)[L_RUN] == ""


def _config(spec: SandboxSpec, tmp_path: Path) -> dict:
    """A pure function of the spec and the host side: no DockerBackend, no engine."""
    api = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")  # given version: no request made
    handle = SandboxHandle(id="agentrl-test", backend="docker", endpoint=AgentEndpoint("unix", "x"),
                           labels={"agentrl.owner": "agentrl"})
    return container_config(api, handle, spec, tmp_path / "agentrl-test", host=HostSide.here())


def test_spec_becomes_limits_and_hardening(tmp_path: Path) -> None:
    spec = SandboxSpec(cpus=1.5, memory="512m", pids=100, disk="64m", ttl_s=120)
    cfg = _config(spec, tmp_path)
    hc = cfg["host_config"]
    assert hc["NanoCpus"] == 1_500_000_000
    assert hc["Memory"] == hc["MemorySwap"] == 512 * 1024**2  # equal: no swap
    assert hc["PidsLimit"] == 100
    assert hc["NetworkMode"] == "none"
    assert hc["ReadonlyRootfs"] is True and hc["CapDrop"] == ["ALL"] and hc["Init"] is True
    # uid-separated (root host), the commands run under agentrl's syscall policy alone (the spawner installs it):
    # Docker's profile would refuse some probes first, uncounted; without a spawner Docker's default stays on
    assert hc["SecurityOpt"] == ["no-new-privileges", *(["seccomp=unconfined"] if os.geteuid() == 0 else [])]
    assert f"size={64 * 1024**2}" in hc["Tmpfs"]["/workspace"] and "/tmp" in hc["Tmpfs"]
    assert any(b.endswith(":/agentrl/agent.pyz:ro") for b in hc["Binds"])
    assert any(b.endswith(":/agentrl-sock:rw") for b in hc["Binds"])
    if os.geteuid() == 0:  # uid separation: the agent is container root with 3 capabilities, commands are 1000
        assert cfg["user"] == "0:0" and sorted(hc["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
        assert cfg["command"][-2:] == ["--run-as", "1000:1000"] and "uid=1000,gid=1000" in hc["Tmpfs"]["/workspace"]
    else:  # one uid: the host user's, no capability at all
        assert cfg["user"] == f"{os.geteuid()}:{os.getegid()}" and not hc.get("CapAdd")
        assert "--run-as" not in cfg["command"]
    assert cfg["command"][:2] == ["python3", "-c"] and "120" in cfg["command"]  # the TTL alarm
    assert "docker.sock" not in str(cfg)


def test_the_backend_sends_the_pure_config(tmp_path: Path) -> None:
    """DockerBackend builds each container from specs.container_config with this host side (no cgroup plan here)."""
    from agentrl.sandbox.docker import DockerBackend

    api = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")
    handle = SandboxHandle(id="agentrl-test", backend="docker", endpoint=AgentEndpoint("unix", "x"), labels={})
    spec = SandboxSpec(disk="64m", network=True)
    got = DockerBackend(state_dir=tmp_path, network="mynet")._container_config(api, handle, spec, tmp_path / "s")
    assert got == container_config(api, handle, spec, tmp_path / "s", host=HostSide.here(network="mynet"))
    assert got["host_config"]["NetworkMode"] == "mynet"


def test_the_ipc_namespace_removes_detached_segments(tmp_path: Path) -> None:
    """The agent's container owns the IPC namespace (the commands' container joins it): a SysV segment goes with its
    last process, so no memory outlives every command to make the OOM killer take the relay."""
    assert _config(SandboxSpec(), tmp_path)["host_config"]["Sysctls"] == {"kernel.shm_rmid_forced": "1"}


def test_network_is_an_explicit_opt_in(tmp_path: Path) -> None:
    assert _config(SandboxSpec(network=True), tmp_path)["host_config"]["NetworkMode"] == "bridge"


@pytest.mark.parametrize("state, cause", [
    (None, "deleted"),
    ({"Status": "removing", "Running": False}, "deleted"),
    ({"Status": "running", "Running": True}, None),
    ({"Status": "exited", "Running": False, "ExitCode": 137, "OOMKilled": True}, "oom"),
    # not uid-separated (a non-root host): a command may have killed its own agent, so no proof of an outside kill
    ({"Status": "exited", "Running": False, "ExitCode": 137, "OOMKilled": False}, "signal:9"),
    ({"Status": "exited", "Running": False, "ExitCode": 142, "OOMKilled": False}, "signal:14"),
    ({"Status": "exited", "Running": False, "ExitCode": 0}, "exited:0"),
    ({"Status": "exited", "Running": False, "ExitCode": 2}, "exited:2"),
])
def test_container_death_cause(state: dict | None, cause: str | None) -> None:
    from agentrl.sandbox.docker import container_death_cause

    assert container_death_cause(state) == cause


@pytest.mark.parametrize("code, engine_kill, cause", [
    (0, False, "killed:15"), (137, True, "killed:9"), (142, False, "signal:14"), (1, False, "exited:1"),
    # a SIGKILL exit with no OOMKilled flag and no kill event of the engine: the OOM killer may have taken the agent
    # without the runtime saying so (gVisor never does): never an outside cause, the policy's
    (137, False, "sigkill_unproven"),
])
def test_a_uid_separated_agent_ending_on_sigterm_was_stopped_from_outside(code: int, engine_kill: bool,
                                                                         cause: str) -> None:
    """The agent exits 0 only on SIGTERM, which no command can send a uid-separated agent: `docker stop`, or
    dockerd stopping its containers as it shuts down (a restart; it still answers inspect then). A SIGKILL is from
    outside only with the engine's record of sending it."""
    from agentrl.sandbox.docker import container_death_cause

    state = {"Status": "exited", "Running": False, "ExitCode": code, "OOMKilled": False}
    assert container_death_cause(state, uid_separated=True, engine_kill=engine_kill) == cause


def test_only_an_engine_sigkill_without_an_oom_is_a_record_of_an_outside_kill() -> None:
    from agentrl.sandbox.docker.specs import engine_killed

    def kill(signal: str) -> dict:
        return {"Action": "kill", "Actor": {"Attributes": {"signal": signal}}}

    assert engine_killed([kill("9")]) and engine_killed([kill("SIGKILL")])
    assert engine_killed([{"status": "kill", "Actor": {"Attributes": {"signal": "KILL"}}}])  # older engines' field
    assert not engine_killed([kill("15")]) and not engine_killed([])
    assert not engine_killed([kill("9"), {"Action": "oom"}]), "an OOM of the container: never proof of an outside kill"


def test_writable_dirs_are_tmpfs_owned_like_the_workspace(tmp_path: Path) -> None:
    cfg = _config(SandboxSpec(disk="64m", writable_dirs=("/repo",)), tmp_path)
    tmpfs = cfg["host_config"]["Tmpfs"]
    assert tmpfs["/repo"] == tmpfs["/workspace"], "same size and owner as the workspace"
    agent = cfg["command"]
    assert agent[agent.index("--writable") + 1] == "/repo", "the agent serves files there"
    assert "--writable" not in _config(SandboxSpec(), tmp_path)["command"]


def test_each_engine_has_its_own_socket_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep removes socket dirs whose sandbox its engine does not know: two engines must never share the dir."""
    from agentrl.sandbox.docker import default_socket_root

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    default = default_socket_root()
    other = default_socket_root("unix:///run/other/docker.sock")
    assert other != default and other.parent == default.parent
    assert default_socket_root("unix:///run/other/docker.sock") == other  # stable across runs
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other/docker.sock")
    assert default_socket_root() == other  # the SDK picks $DOCKER_HOST: so does the dir


@pytest.mark.parametrize("separation, root, info, mode", [
    ("auto", True, {"CgroupDriver": "systemd", "CgroupVersion": "2"}, "containers"),  # a typical modern host
    ("auto", True, {"CgroupDriver": "cgroupfs", "CgroupVersion": "2"}, "containers"),
    ("cgroups", True, {"CgroupDriver": "systemd", "CgroupVersion": "2"}, ""),  # asked for host cgroups only: none
    ("containers", True, {"CgroupDriver": "cgroupfs", "CgroupVersion": "1"}, "containers"),
    ("auto", False, {"CgroupDriver": "systemd", "CgroupVersion": "2"}, ""),  # no uid of their own for commands
    ("off", True, {"CgroupDriver": "systemd", "CgroupVersion": "2"}, ""),
])
def test_the_separation_layout_follows_the_engine(separation: str, root: bool, info: dict, mode: str) -> None:
    """Where the engine gives no host cgroups (cgroup v2, the systemd driver), `auto` puts the agent in a container
    of its own rather than sharing the commands' limits; only a non-root host side (or `off`) keeps one budget."""
    class Api:
        def info(self) -> dict:
            return info

    limiter, got, why = layouts.probe(Api(), separation=separation, root_host=root, docker_host="unix:///x.sock")
    assert (limiter, got) == (None, mode), why
    assert got or why, "a layout without separation says why"


def test_an_unknown_separation_is_a_config_error() -> None:
    from agentrl.errors import ConfigError
    from agentrl.sandbox.docker import DockerBackend

    with pytest.raises(ConfigError, match="separation"):
        DockerBackend(separation="maybe")
