"""What a docker sandbox is: its containers' configuration, labels and volumes, the sweep rule over its labels, and
its death cause from the engine's state. Pure functions of the spec, the host side and the separation plan, no I/O
(unit-tested without a Docker Engine); `backend.py` sends them to the engine.

One sandbox = one container:

    command    python3 (alarm at ttl_s, then exec) python3 -I -S /agentrl/agent.pyz --unix /agentrl-sock/agent.sock
               --workspace /workspace [--run-as 1000:1000]; docker-init (tini) is pid 1. As container root, the
               first python3 also copies itself to /agentrl/judge-python, mode 0111: the image's own interpreter,
               executable but not readable by the command user, so graders started from it are non-dumpable from
               their execve (`Sandbox.judge_python`; any image with python3, none when it is a venv's)
    mounts     a small root-owned tmpfs at /agentrl; the agent's artifact (sandbox/artifact.py) read-only at
               /agentrl/agent.pyz; the host socket dir at
               /agentrl-sock;
               tmpfs /workspace, /tmp and each of spec.writable_dirs (size = spec.disk, owned by the sandbox user;
               the agent gets --writable for the latter)
    limits     nano_cpus = spec.cpus, mem_limit == memswap_limit = spec.memory (no swap), pids_limit = spec.pids;
               resource-separated (separation.py): on the `commands` cgroup instead, the container itself is the
               agent's
    hardening  read-only root fs, cap_drop ALL, no-new-privileges, network "none" unless
               spec.network (then `network`, default "bridge"); uid separation when the host side is root: the
               agent is container uid 0 with only CAP_SETUID, CAP_SETGID, CAP_KILL added back and runs every command
               as 1000:1000 (`--run-as`), which cannot signal, ptrace or read it nor reach its socket directory;
               seccomp: agentrl's syscall policy, which the agent's spawner installs on every command, is the only
               one where commands run uid-separated (Docker's profile off there: its refusals would come first,
               uncounted); Docker's default profile without uid separation (no spawner, no policy of ours)
    labels     agentrl.owner=agentrl, agentrl.run_id, agentrl.owner_host, agentrl.owner_pid, agentrl.owner_start,
               agentrl.created_at, agentrl.ttl_s, agentrl.sock_dir

Two containers (separation.py): the agent's (`container_config` with `volumes`) and `<name>-cmd`, the commands'
(`commands_config`), both mounting the same tmpfs volumes (`volume_options`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.sandbox import limits
from agentrl.sandbox.agent.protocol import ARTIFACT_NAME
from agentrl.sandbox.artifact import relay_source, shipped
from agentrl.sandbox.base import SIGKILL_UNPROVEN, SandboxHandle, SandboxSpec
from agentrl.sandbox.docker.separation import separated_config
from agentrl.sandbox.ownership import OwnerRecord, caller_run_id, owner_gone, sweep_selects, ttl_passed

try:
    from docker.types import Ulimit
except ImportError:  # pragma: no cover - exercised only without the [docker] extra
    Ulimit = None

OWNER = "agentrl"
L_OWNER, L_RUN, L_HOST, L_PID, L_START = ("agentrl.owner", "agentrl.run_id", "agentrl.owner_host",
                                          "agentrl.owner_pid", "agentrl.owner_start")
L_CREATED, L_TTL, L_SOCK = "agentrl.created_at", "agentrl.ttl_s", "agentrl.sock_dir"
L_CGROUPS = "agentrl.cgroups"  # the sandbox's host cgroup directories (resource-separated), ":"-joined
# two containers: on the commands' container and the volumes, the sandbox they belong to; on the commands' container
# its role ("commands"); on both containers, the ":"-joined volume names (their presence marks the layout)
L_SANDBOX, L_ROLE, L_VOLUMES = "agentrl.sandbox", "agentrl.role", "agentrl.volumes"
COMMANDS_SUFFIX = "-cmd"  # two containers: the commands' container is named <sandbox>-cmd
AGENT_CONTAINER_CPUS, AGENT_CONTAINER_MEMORY = 0.25, 256 << 20  # two containers: the agent's own working set
AGENT_DIR_BYTES = 64 << 20  # the /agentrl tmpfs (agent.pyz bound inside, judge-python copied by root)
AGENT_DIR = "/agentrl"
AGENT_PATH = f"{AGENT_DIR}/{ARTIFACT_NAME}"
SOCK_DIR = "/agentrl-sock"
WORKSPACE = "/workspace"
SANDBOX_UID = 1000
AGENT_CAPS = ["SETUID", "SETGID", "KILL"]  # the workspace tmpfs is created owned by 1000: no CAP_CHOWN needed
JUDGE_PYTHON = f"{AGENT_DIR}/judge-python"  # where the agent looks for it: next to agent.pyz
# argv: TTL, then the command to exec; SIGALRM's default action ends the agent at the TTL (the alarm survives exec).
# First, as root: the execute-only copy of this interpreter for graders (best effort: graders fall back without it).
_TTL_EXEC = f"""import os, shutil, signal, sys
if os.geteuid() == 0 and sys.prefix == sys.base_prefix:
    try:
        shutil.copyfile(os.path.realpath(sys.executable), {JUDGE_PYTHON!r})
        os.chmod({JUDGE_PYTHON!r}, 0o111)
    except OSError as e:
        print("agentrl: no execute-only interpreter for graders:", e, file=sys.stderr)
signal.alarm(int(sys.argv[1]))
os.execvp(sys.argv[2], sys.argv[2:])
"""
RUN_ID_KEYS = (L_RUN, "agentrl/run-id", "run_id")  # where a caller's labels may carry the run id


@dataclass(frozen=True)
class HostSide:
    """What a container's configuration takes from the host side that creates it."""

    root: bool  # the host side is root: uid separation (the agent container root, the commands SANDBOX_UID)
    command_user: str  # "uid:gid" of the commands and owner of the workspace
    agent_file: Path  # the agent's artifact (this tree's, another artifact, an agent dir's), bound ro at AGENT_PATH
    network: str  # the Docker network of sandboxes whose spec allows network

    @classmethod
    def here(cls, *, agent_file: Path | None = None, network: str = "bridge") -> HostSide:
        """This process: separated from the (root) agent, commands are 1000; otherwise they are the host user."""
        root = os.geteuid() == 0
        user = f"{SANDBOX_UID}:{SANDBOX_UID}" if root else f"{os.geteuid()}:{os.getegid()}"
        return cls(root=root, command_user=user, agent_file=shipped(agent_file), network=network)


# ------------------------------------------------------------------ labels and the sweep rule


def sandbox_labels(spec: SandboxSpec, labels: dict[str, str], sock_dir: Path, owner: OwnerRecord,
                   now: float) -> dict[str, str]:
    """The labels of a new sandbox's container(s): the caller's, then ownership (owner record, creation time, TTL,
    socket dir) and the run id from wherever the caller's labels carry it."""
    own = {L_OWNER: OWNER, L_HOST: owner.host, L_PID: str(owner.pid), L_START: owner.start,
           L_CREATED: f"{now:.3f}", L_TTL: str(spec.ttl_s), L_SOCK: str(sock_dir)}
    return {**{k: str(v) for k, v in labels.items()}, **own, L_RUN: caller_run_id(labels, RUN_ID_KEYS)}


def should_remove(labels: dict[str, str], *, now: float, host: str, run_id: str | None, all_runs: bool) -> bool:
    """The sweep rule (ownership.sweep_selects) wired to a container's labels: agentrl's only; orphaned when its TTL
    passed or its owner on this host is gone (other hosts' owners: TTL only)."""
    if labels.get(L_OWNER) != OWNER:
        return False
    return sweep_selects(run=labels.get(L_RUN), run_id=run_id, all_runs=all_runs, orphaned=lambda: (
        ttl_passed(labels.get(L_CREATED), labels.get(L_TTL), now)
        or owner_gone(labels.get(L_HOST), labels.get(L_PID, ""), labels.get(L_START), here=host)))


# ------------------------------------------------------------------ the death cause


def container_death_cause(state: dict[str, Any] | None, *, uid_separated: bool = False,
                          engine_kill: bool = False) -> str | None:
    """The death cause of a container from its inspect State (None: no such container). `uid_separated`: the
    commands run under another uid than the agent (root host), so they cannot signal it. `engine_kill`: the
    engine's events show a SIGKILL sent through its API (`docker kill`, `docker stop` past its grace, `docker rm
    -f`) and no OOM. Pure, unit-tested.

    A SIGKILL exit without OOMKilled is an outside kill only with that positive record: the OOMKilled flag is the
    runtime's report, which some runtimes never make (gVisor) and which a kill of a process other than the
    container's main one may not set, so its absence proves nothing, and an agent the OOM killer took must never
    read as killed from outside. Without the record: SIGKILL_UNPROVEN, which attribution judges by separation (infra
    where the policy can reach neither the agent's uid nor its resources, the policy's otherwise)."""
    if state is None or state.get("Status") in ("removing", "dead"):
        return "deleted"
    if state.get("Running") or state.get("Status") in ("created", "restarting", "paused"):
        return None
    code = int(state.get("ExitCode") or 0)
    if state.get("OOMKilled") and code in (137, -9):
        return "oom"
    if code in (137, -9) and uid_separated:
        # SIGKILL of pid 1 (docker-init) or of the agent (root in the container): nothing inside can send it (pid 1
        # ignores signals from its own namespace; the commands run as another uid under no-new-privileges), so it
        # came from outside through the engine (its kill event) or from the kernel's OOM killer, which the engine
        # may not have flagged. Without uid separation a command can SIGKILL its own agent: no proof, signal:9
        return "killed:9" if engine_kill else SIGKILL_UNPROVEN
    if code == 0 and uid_separated:
        # the agent ends with status 0 only on SIGTERM (its handler cleans up and exits 0), which docker-init passes
        # on from outside and no command can send it: `docker stop`, or dockerd stopping every container as it shuts
        # down (it still answers inspect for a moment then: the cause is seen before the engine goes away)
        return "killed:15"
    return f"signal:{code - 128}" if code > 128 else f"exited:{code}"


def engine_killed(events: list[dict[str, Any]]) -> bool:
    """The engine's events of a container (kill, oom) record a SIGKILL sent to it through the API and no OOM of it:
    the positive record `container_death_cause(engine_kill=True)` needs."""
    actions = [(e.get("Action") or e.get("status"), (e.get("Actor") or {}).get("Attributes") or {}) for e in events]
    if any(action == "oom" for action, _ in actions):
        return False
    return any(action == "kill" and str(attrs.get("signal")).upper() in ("9", "SIGKILL", "KILL")
               for action, attrs in actions)


# ------------------------------------------------------------------ containers and volumes


def agent_container_memory(spec: SandboxSpec) -> int:
    """The agent's container's memory limit (two containers): its own working set, AGENT_CONTAINER_MEMORY (flat:
    files cross the agent FILE_CHUNK at a time), plus every byte of the tmpfs volumes it writes into (/agentrl, the
    workspace and each writable dir). A tmpfs page is charged to the cgroup of the process that writes it and,
    without swap, cannot be reclaimed: the files the agent writes for the host (an edit, a grading tree) stay on its
    bill until removed. With room for all of them, a full volume answers ENOSPC (the policy's doing, scored) before
    the agent's container could run out of memory, so data can never OOM-kill the agent."""
    return AGENT_CONTAINER_MEMORY + AGENT_DIR_BYTES + spec.disk_bytes * (1 + len(spec.writable_dirs))


def commands_container(handle: SandboxHandle) -> str | None:
    """The commands' container of a two-container sandbox (None: one container)."""
    return handle.id + COMMANDS_SUFFIX if handle.labels.get(L_VOLUMES) else None


def relay_name(sandbox: str) -> str:
    """The relay's abstract socket (two containers): in the agent container's network namespace, one per sandbox."""
    return f"agentrl-relay-{sandbox}"


def volume_options(spec: SandboxSpec, command_user: str) -> dict[str, str]:
    """Two containers: the tmpfs mounts both see (mount path -> tmpfs options), sized like the single container's
    tmpfs mounts."""
    uid, gid = command_user.split(":")
    owned = f"size={spec.disk_bytes},uid={uid},gid={gid},mode=0755"
    return {AGENT_DIR: f"size={AGENT_DIR_BYTES},mode=0755", WORKSPACE: owned,
            "/tmp": f"size={spec.disk_bytes},mode=1777",
            **{d: owned for d in spec.writable_dirs}}


def volume_labels(handle: SandboxHandle) -> dict[str, str]:
    """The labels of a sandbox's volumes (two containers), for sweep()."""
    return {L_OWNER: OWNER, L_SANDBOX: handle.id, L_RUN: handle.labels.get(L_RUN, "")}


def _ulimits() -> list[Any]:
    return [Ulimit(name="core", soft=0, hard=0), Ulimit(name="nofile", soft=4096, hard=4096)]


def commands_config(api: Any, handle: SandboxHandle, spec: SandboxSpec, volumes: dict[str, str]) -> dict:
    """Two containers: where the commands run, with the spec's limits, in the agent container's pid, ipc and
    network namespaces; its main process is the relay (uid 0, only SETUID / SETGID), which starts the agent's
    command spawner here (the agent's --relay). `api`: a docker.APIClient, for its host-config builder (no request)."""
    name = handle.id + COMMANDS_SUFFIX  # commands_container(handle) once the volumes are labelled
    binds = {vol: {"bind": path, "mode": "ro" if path == AGENT_DIR else "rw"} for path, vol in volumes.items()}
    host_config = api.create_host_config(
        binds=binds, nano_cpus=int(spec.cpus * 1e9), mem_limit=spec.memory_bytes,
        memswap_limit=spec.memory_bytes, pids_limit=spec.pids, network_mode=f"container:{handle.id}",
        pid_mode=f"container:{handle.id}", ipc_mode=f"container:{handle.id}", read_only=True,
        cap_drop=["ALL"], cap_add=["SETUID", "SETGID"],  # commands: agentrl's syscall policy, not Docker's
        security_opt=["no-new-privileges", "seccomp=unconfined"],
        ulimits=_ulimits(),
        log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
    )
    return {"image": spec.image, "name": name, "user": "0:0", "working_dir": WORKSPACE,
            "command": ["python3", "-I", "-S", "-c", relay_source(), relay_name(handle.id)],
            "labels": {**handle.labels, L_SANDBOX: handle.id, L_ROLE: "commands"},
            "environment": {"HOME": WORKSPACE}, "host_config": host_config}


def container_config(api: Any, handle: SandboxHandle, spec: SandboxSpec, sock_dir: Path, *, host: HostSide,
                     plan: limits.LimitPlan | None = None, volumes: dict[str, str] | None = None) -> dict:
    """The (agent's) container. `plan` (host cgroups): the agent's cgroup parent and the commands' cgroups bound
    inside. `volumes` (two containers): its mounts are the shared tmpfs volumes and its limits the agent's own; the
    commands run in the other container (`commands_config`). `api`: a docker.APIClient, for its host-config builder
    (no request)."""
    uid, gid = host.command_user.split(":")
    tmpfs_opts = f"size={spec.disk_bytes},uid={uid},gid={gid},mode=0755,exec"
    if plan is not None:
        resources, extra_binds, agent_args = separated_config(plan)
    elif volumes is not None:
        memory = agent_container_memory(spec)
        resources = {"nano_cpus": int(AGENT_CONTAINER_CPUS * 1e9), "mem_limit": memory,
                     "memswap_limit": memory, "pids_limit": limits.AGENT_PIDS,
                     "ipc_mode": "shareable"}  # the commands' container joins it: one SysV namespace to clean
        extra_binds = {vol: {"bind": path, "mode": "rw"} for path, vol in volumes.items()}
        agent_args = ["--relay", relay_name(handle.id)]
    else:
        resources = {"nano_cpus": int(spec.cpus * 1e9), "mem_limit": spec.memory_bytes,
                     "memswap_limit": spec.memory_bytes, "pids_limit": spec.pids}
        extra_binds, agent_args = {}, []
    tmpfs = {} if volumes is not None else {
        WORKSPACE: tmpfs_opts, "/tmp": f"size={spec.disk_bytes},mode=1777,exec",
        AGENT_DIR: f"size={AGENT_DIR_BYTES},mode=0755,exec",  # root's: agent.pyz bound inside, judge-python copied
        **{d: tmpfs_opts for d in spec.writable_dirs}}  # e.g. /repo: owned by the command user
    host_config = api.create_host_config(
        binds={str(host.agent_file): {"bind": AGENT_PATH, "mode": "ro"},
               str(sock_dir): {"bind": SOCK_DIR, "mode": "rw"}, **extra_binds},
        tmpfs=tmpfs,
        **resources, network_mode=host.network if spec.network else "none",
        read_only=True, cap_drop=["ALL"], cap_add=AGENT_CAPS if host.root else None,
        # this container's IPC namespace (the commands' container joins it) removes a SysV segment when its last
        # process detaches: memory no process holds would make the OOM killer kill on to the relay (kubernetes/pods.py)
        sysctls={"kernel.shm_rmid_forced": "1"},
        # uid-separated, every command runs under agentrl's own syscall policy (the spawner's): Docker's default
        # profile would refuse some of its probes first, uncounted; without a spawner it stays the only one
        security_opt=["no-new-privileges", *(["seccomp=unconfined"] if host.root else [])], init=True,
        ulimits=_ulimits(),
        log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
    )
    agent = ["python3", "-I", "-S", AGENT_PATH, "--unix", f"{SOCK_DIR}/agent.sock", "--workspace", WORKSPACE]
    if host.root:
        agent += ["--run-as", host.command_user]
    if spec.writable_dirs:
        agent += ["--writable", ":".join(spec.writable_dirs)]
    agent += agent_args
    command = ["python3", "-c", _TTL_EXEC, str(spec.ttl_s), *agent]
    return {"image": spec.image, "name": handle.id, "command": command,
            "user": "0:0" if host.root else host.command_user, "working_dir": WORKSPACE,
            "hostname": "sandbox", "labels": handle.labels,
            "environment": {"HOME": WORKSPACE}, "host_config": host_config}
