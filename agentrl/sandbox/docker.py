"""Docker backend: sandboxes as hardened containers. The control plane only.

Owns: creating, starting, watching and removing containers through the Docker SDK (every blocking call runs on
this backend's own thread pool, never on the event loop), the limits and hardening of each container, the
per-sandbox host socket directory, ownership labels + TTL, and sweeping orphans. Does not own: commands (they go to
the in-sandbox agent over the unix socket through `client.py`; never `docker exec`), leasing and warm pools
(`pool.py`).

One sandbox = one container:

    command    python3 (alarm at ttl_s, then exec) python3 -I -S /agentrl/agent.pyz --unix /agentrl-sock/agent.sock
               --workspace /workspace [--run-as 1000:1000]; docker-init (tini) is pid 1. As container root, the
               first python3 also copies itself to /agentrl/judge-python, mode 0111: the image's own interpreter,
               executable but not readable by the command user, so graders started from it are non-dumpable from
               their execve (`Sandbox.judge_python`; any image with python3, none when it is a venv's)
    mounts     a small root-owned tmpfs at /agentrl; the agent's artifact (artifact.py) read-only at
               /agentrl/agent.pyz; the host socket dir at
               /agentrl-sock;
               tmpfs /workspace, /tmp and each of spec.writable_dirs (size = spec.disk, owned by the sandbox user;
               the agent gets --writable for the latter)
    limits     nano_cpus = spec.cpus, mem_limit == memswap_limit = spec.memory (no swap), pids_limit = spec.pids;
               resource-separated (below): on the `commands` cgroup instead, the container itself is the agent's
    hardening  read-only root fs, cap_drop ALL, no-new-privileges, network "none" unless
               spec.network (then `network`, default "bridge"); uid separation when the host side is root: the
               agent is container uid 0 with only CAP_SETUID, CAP_SETGID, CAP_KILL added back and runs every command
               as 1000:1000 (`--run-as`), which cannot signal, ptrace or read it nor reach its socket directory;
               seccomp: agentrl's syscall policy, which the agent's spawner installs on every command, is the only
               one where commands run uid-separated (Docker's profile off there: its refusals would come first,
               uncounted); Docker's default profile without uid separation (no spawner, no policy of ours)
    labels     agentrl.owner=agentrl, agentrl.run_id, agentrl.owner_host, agentrl.owner_pid, agentrl.owner_start,
               agentrl.created_at, agentrl.ttl_s, agentrl.sock_dir

Resource separation (`resources_separated`; `separation`: "auto" picks the first that works, "cgroups",
"containers" or "off"). Host cgroups (when the host side is root, the engine is local, its cgroup driver is
cgroupfs and the host has cgroup v1): like the local backend, each sandbox gets a host cgroup per hierarchy with an
`agent` and a `commands` child (`limits.Limiter.prepare(..., separate=True)`), the spec's memory / pids / CPU limits
on `commands`. The container is created under `agent` (`cgroup_parent`), so docker-init, the agent and its spawner
live there with only the agent's pids limit; the sandbox's cgroup directories are bind-mounted at /agentrl-cgroup/N
(root-owned files: commands, uid 1000, cannot write them) and the agent starts every command in `commands`
(`--cgroups v1:...`) and kills through it. A command filling memory, pids or CPU then hits only its own limits: the
kernel's OOM killer picks inside `commands`, never the agent. Two containers (any engine the host side is root
of: cgroup v2, the systemd driver): the agent's container (its own 0.25 CPU, pids, and 256 MiB plus room for every
tmpfs volume it writes into: `agent_container_memory`) and `<name>-cmd`, the commands' container with the spec's
limits, in the agent container's pid, ipc and network namespaces, both mounting
the same tmpfs volumes (`<name>-vN`: /agentrl, /workspace, /tmp, the writable dirs); its main process is the relay
(agent/relay_program.py, as text: root with SETUID / SETGID only), which starts the agent's command spawner there, as on
Kubernetes. A non-root host side gets neither: the container's limits cover the agent and its commands together
and the agent says so (`resources_separated: false`); every death is then the policy's.

Leak-proofing: the agent gets SIGALRM at ttl_s, so the container stops even if nobody ever sweeps; `sweep()`
removes containers whose TTL passed, whose owner process on this host is gone (pid + start time, so a reused pid is
not mistaken for the owner), or of a given run.

The socket directory is created by the host root:root 0700: the agent (container root, the owner) binds its socket
there and commands (uid 1000) cannot enter it, so they can neither replace the socket nor write to the host's disk
through it. A non-root host user runs sandboxes under its own uid:gid with no separation (so the 0600 socket is
reachable; `uid_separated: false`) and keeps the directory under $XDG_RUNTIME_DIR (a small per-user tmpfs) when that
is set; the directory is its own throughout.

The Docker Engine must be local (bind mounts of host paths): DOCKER_HOST over TCP/SSH to another machine does not work.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from agentrl.errors import (
    ConfigError,
    MissingDependencyError,
    SandboxEngineUnreachable,
    SandboxError,
    SandboxStartError,
)
from agentrl.sandbox import limits
from agentrl.sandbox.agent.protocol import ARTIFACT_NAME
from agentrl.sandbox.artifact import relay_source, shipped
from agentrl.sandbox.base import SIGKILL_UNPROVEN, AgentEndpoint, SandboxHandle, SandboxSpec
from agentrl.sandbox.client import probe_health
from agentrl.sandbox.ownership import OwnerRecord, owner_gone

try:
    import docker
    import docker.errors
    import requests
    from docker.types import Ulimit
except ImportError:  # pragma: no cover - exercised only without the [docker] extra
    docker = None

log = logging.getLogger("agentrl.sandbox")
T = TypeVar("T")

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
CGROUP_MOUNT = "/agentrl-cgroup"  # where they appear in the container: /agentrl-cgroup/0, /1, ...
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
STALE_DIR_S = 300.0  # a socket dir with no container is removed by sweep() only when older than this
SEPARATIONS = ("auto", "cgroups", "containers", "off")


def _owner_dead(labels: dict[str, str], host: str) -> bool:
    """The container's owner ran on this host and is gone (ownership.owner_gone); other hosts' owners: TTL only."""
    return owner_gone(labels.get(L_HOST), labels.get(L_PID, ""), labels.get(L_START), here=host)


def _expired(labels: dict[str, str], now: float) -> bool:
    try:
        return now > float(labels[L_CREATED]) + float(labels[L_TTL])
    except (KeyError, ValueError):
        return False


def should_remove(labels: dict[str, str], *, now: float, host: str, run_id: str | None, all_runs: bool) -> bool:
    """The sweep rule for one agentrl container (pure, so it is unit-tested without Docker)."""
    if labels.get(L_OWNER) != OWNER:
        return False
    if all_runs:
        return True
    if run_id is not None:
        return labels.get(L_RUN) == run_id
    return _expired(labels, now) or _owner_dead(labels, host)


DEATH_SETTLE_S = 3.0  # how long death_cause waits for dockerd to record an exit it has not seen yet


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


def agent_container_memory(spec: SandboxSpec) -> int:
    """The agent's container's memory limit (two containers): its own working set, AGENT_CONTAINER_MEMORY (flat:
    files cross the agent FILE_CHUNK at a time), plus every byte of the tmpfs volumes it writes into (/agentrl, the
    workspace and each writable dir). A tmpfs page is charged to the cgroup of the process that writes it and,
    without swap, cannot be reclaimed: the files the agent writes for the host (an edit, a grading tree) stay on its
    bill until removed. With room for all of them, a full volume answers ENOSPC (the policy's doing, scored) before
    the agent's container could run out of memory, so data can never OOM-kill the agent."""
    return AGENT_CONTAINER_MEMORY + AGENT_DIR_BYTES + spec.disk_bytes * (1 + len(spec.writable_dirs))


def _commands_container(handle: SandboxHandle) -> str | None:
    """The commands' container of a two-container sandbox (None: one container)."""
    return handle.id + COMMANDS_SUFFIX if handle.labels.get(L_VOLUMES) else None


def _relay_name(sandbox: str) -> str:
    """The relay's abstract socket (two containers): in the agent container's network namespace, one per sandbox."""
    return f"agentrl-relay-{sandbox}"


def _hierarchy_path(cgroup_dir: str) -> str | None:
    """`/sys/fs/cgroup/<controller>/a/b` -> `/a/b` (what docker's cgroupfs driver takes as a cgroup parent)."""
    parts = Path(cgroup_dir).parts
    if len(parts) < 5 or parts[:4] != ("/", "sys", "fs", "cgroup"):
        return None
    return "/" + "/".join(parts[5:])


def _why(e: Exception) -> str:
    if isinstance(e, docker.errors.APIError):
        return str(e.explanation or e)
    return f"{e} (is dockerd running? start it, e.g. .ci/docker-setup.sh)"


def default_socket_root(docker_host: str | None = None) -> Path:
    """Where per-sandbox socket dirs live: the temp dir for root, else $XDG_RUNTIME_DIR (a per-user tmpfs). One
    directory per engine (`docker_host`; None and $DOCKER_HOST mean the default one): a sweep removes the dirs of
    sandboxes its engine does not know, so two engines must never share one."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    host = docker_host or os.environ.get("DOCKER_HOST") or ""
    suffix = "-" + hashlib.sha256(host.encode()).hexdigest()[:8] if host else ""
    if os.geteuid() != 0 and runtime and os.path.isdir(runtime):
        return Path(runtime) / f"agentrl-docker{suffix}"
    return Path(tempfile.gettempdir()) / f"agentrl-docker-{os.geteuid()}{suffix}"


class DockerBackend:
    """Sandboxes as containers of one local Docker Engine. Blocking SDK calls run on a private thread pool of
    `max_workers` threads (also the SDK's connection-pool size), so a slow dockerd never blocks the event loop and
    never takes more than that many threads. `state_dir` holds the per-sandbox socket dirs (default:
    `default_socket_root()`); `network` is the Docker network of sandboxes whose spec allows network."""

    name = "docker"

    def __init__(self, *, docker_host: str | None = None, state_dir: str | os.PathLike[str] | None = None,
                 network: str = "bridge", max_workers: int = 16, api_timeout_s: float = 60.0,
                 start_timeout_s: float = 60.0, agent_file: Path | None = None,
                 separate_resources: bool = True, separation: str = "auto") -> None:
        if docker is None:
            raise MissingDependencyError(
                "the docker sandbox backend needs the Docker SDK: pip install 'agentrl[docker]'")
        if max_workers < 1:
            raise ConfigError(f"DockerBackend max_workers={max_workers}: use 1 or more")
        self._docker_host = docker_host
        self._socket_root = (Path(state_dir) if state_dir is not None else default_socket_root(docker_host)).absolute()
        self._network = network
        self._max_workers = max_workers
        self._api_timeout_s = api_timeout_s
        self._start_timeout_s = start_timeout_s
        self._agent_file = shipped(agent_file)  # this tree's artifact; agent_file: another artifact or agent dir
        self._threads = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentrl-docker")
        # separate_resources=False: one budget for agent and commands, as separation "off" (benchmarks compare)
        if separation not in SEPARATIONS:
            raise ConfigError(f"DockerBackend separation={separation!r}: use one of {', '.join(SEPARATIONS)}")
        self.separation = separation if separate_resources else "off"
        self._mode: str | None = None  # "cgroups" | "containers" | "" (none), decided once
        self._limiter: limits.Limiter | None = None
        self._separation_checked = False
        self._plans: dict[str, limits.LimitPlan] = {}  # resource-separated sandboxes: their host cgroups
        self._api: Any = None
        self._api_lock = asyncio.Lock()
        self._live: dict[str, SandboxHandle] = {}  # created by this object and not destroyed yet
        self._unremoved: set[str] = set()  # names in _live whose removal failed (dockerd down): retried later
        owner = OwnerRecord.here()
        self._host, self._pid, self._pid_start = owner.host, owner.pid, owner.start
        self._root_host = os.geteuid() == 0
        # who owns the workspace and runs commands: 1000 when separated from the (root) agent, else the host user
        self._command_user = f"{SANDBOX_UID}:{SANDBOX_UID}" if self._root_host else f"{os.geteuid()}:{os.getegid()}"
        if not self._root_host:
            log.warning("DockerBackend: not running as root, so each container runs its agent and commands under one "
                        "uid (uid_separated=false): a command can kill or trace its sandbox's agent. Run as root for "
                        "uid separation.")

    def __repr__(self) -> str:
        return f"DockerBackend(docker_host={self._docker_host!r}, socket_root={str(self._socket_root)!r})"

    # ------------------------------------------------------------------ plumbing

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking SDK call on the backend's threads. If the caller is cancelled, still wait for the call to
        finish (at most api_timeout_s) before re-raising: a cancelled create must not finish creating a container
        after the cleanup that removes it has already run."""
        fut = asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            if not fut.cancelled():
                fut.exception()  # retrieved: the cancellation is what propagates
            raise

    async def api(self) -> Any:
        """The low-level `docker.APIClient`, created on first use (creating it asks dockerd for its version)."""
        async with self._api_lock:
            if self._api is None:
                self._api = await self._call(self._connect)
        return self._api

    def _connect(self) -> Any:
        base_url = self._docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        try:
            return docker.APIClient(base_url=base_url, version="auto", timeout=int(self._api_timeout_s),
                                    max_pool_size=self._max_workers)
        except docker.errors.DockerException as e:
            raise SandboxEngineUnreachable(
                f"Docker Engine not reachable at {base_url} ({e}); start dockerd (as root: .ci/docker-setup.sh), or "
                "point sandbox.backend.docker_host / DOCKER_HOST at a running local engine") from e

    # ------------------------------------------------------------------ create

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> SandboxHandle:
        """Create and start one container; return once its agent answers /health. Cancellation-safe: a container
        created by a cancelled or failed call is removed before the exception propagates."""
        name = f"agentrl-{secrets.token_hex(6)}"
        sock_dir = self._socket_root / name
        all_labels = self._labels(spec, labels, sock_dir)
        handle = SandboxHandle(id=name, backend=self.name, labels=all_labels,
                               endpoint=AgentEndpoint(kind="unix", address=str(sock_dir / "agent.sock")))
        if self._unremoved:
            await self._retry_removals()
        self._live[name] = handle
        try:
            await self._call(self._make_sock_dir, sock_dir)
            limiter = await self._separation(await self.api())
            if limiter is not None:
                plan = await self._call(limiter.prepare, name, spec, separate=True)
                self._plans[name] = plan
                handle.labels[L_CGROUPS] = ":".join(plan.cgroups)
            await self._create_and_start(handle, spec, sock_dir)
            await self._wait_ready(handle, time.monotonic() + self._start_timeout_s)
        except BaseException:
            await asyncio.shield(self._discard(handle))
            raise
        return handle

    def _labels(self, spec: SandboxSpec, labels: dict[str, str], sock_dir: Path) -> dict[str, str]:
        own = {L_OWNER: OWNER, L_HOST: self._host, L_PID: str(self._pid), L_START: self._pid_start,
               L_CREATED: f"{time.time():.3f}", L_TTL: str(spec.ttl_s), L_SOCK: str(sock_dir)}
        run_id = next((labels[k] for k in RUN_ID_KEYS if labels.get(k)), "")
        return {**{k: str(v) for k, v in labels.items()}, **own, L_RUN: str(run_id)}

    def _make_sock_dir(self, sock_dir: Path) -> None:
        self._socket_root.mkdir(mode=0o711, parents=True, exist_ok=True)
        st = self._socket_root.lstat()  # in a shared temp dir: refuse a planted symlink or someone else's dir
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise ConfigError(f"sandbox socket directory {self._socket_root} is not a directory owned by uid "
                              f"{os.geteuid()}; remove it or pass another state_dir")
        sock_dir.mkdir(mode=0o700)  # ours (root:root when separated): only the agent, as container root, enters

    async def _create_and_start(self, handle: SandboxHandle, spec: SandboxSpec, sock_dir: Path) -> None:
        api = await self.api()
        if self._mode == "containers":
            volumes = await self._call(self._make_volumes, api, handle, spec)
            configs = [self._container_config(api, handle, spec, sock_dir, volumes=volumes),
                       self._commands_config(api, handle, spec, volumes)]
        else:
            configs = [self._container_config(api, handle, spec, sock_dir)]
        t0 = time.monotonic()
        for config in configs:
            await self._create(api, config, spec)
        t1 = time.monotonic()
        for config in configs:  # the agent's first: the commands' joins its namespaces
            try:
                await self._call(api.start, config["name"])
            except requests.ConnectionError as e:
                raise SandboxEngineUnreachable(f"docker start {config['name']} ({spec.image}) failed: {_why(e)}") from e
            except (docker.errors.DockerException, requests.RequestException) as e:
                raise SandboxStartError(f"docker start {config['name']} ({spec.image}) failed: {_why(e)}") from e
        handle.timings.update(create_s=t1 - t0, start_s=time.monotonic() - t1)

    async def _create(self, api: Any, config: dict, spec: SandboxSpec) -> None:
        try:
            await self._call(api.create_container, **config)
        except docker.errors.ImageNotFound as e:
            raise ConfigError(
                f"sandbox image {spec.image!r} not found in the Docker Engine: build it (agentrl/python: "
                "`sandbox_images/build.sh --offline-base`; an env's per-task images: its own command, e.g. "
                "`python -m agentrl_repo_fix images`), or set sandbox.spec.image to an image that exists") from e
        except requests.ConnectionError as e:  # refused / no socket: dockerd is away, not this container's fault
            raise SandboxEngineUnreachable(f"docker create {config['name']} ({spec.image}) failed: {_why(e)}") from e
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxStartError(f"docker create {config['name']} ({spec.image}) failed: {_why(e)}") from e

    def _make_volumes(self, api: Any, handle: SandboxHandle, spec: SandboxSpec) -> dict[str, str]:
        """Two containers: the tmpfs mounts both see (mount path -> volume name), as tmpfs volumes of the local
        driver (sized like the single container's tmpfs mounts), labelled for sweep() and removed by destroy()."""
        uid, gid = self._command_user.split(":")
        owned = f"size={spec.disk_bytes},uid={uid},gid={gid},mode=0755"
        wanted = {AGENT_DIR: f"size={AGENT_DIR_BYTES},mode=0755", WORKSPACE: owned,
                  "/tmp": f"size={spec.disk_bytes},mode=1777",
                  **{d: owned for d in spec.writable_dirs}}
        labels = {L_OWNER: OWNER, L_SANDBOX: handle.id, L_RUN: handle.labels.get(L_RUN, "")}
        out: dict[str, str] = {}
        for i, (path, opts) in enumerate(wanted.items()):
            name = f"{handle.id}-v{i}"
            api.create_volume(name=name, driver="local", labels=labels,
                              driver_opts={"type": "tmpfs", "device": "tmpfs", "o": opts})
            out[path] = name
        handle.labels[L_VOLUMES] = ":".join(out.values())
        return out

    def _commands_config(self, api: Any, handle: SandboxHandle, spec: SandboxSpec, volumes: dict[str, str]) -> dict:
        """Two containers: where the commands run, with the spec's limits, in the agent container's pid, ipc and
        network namespaces; its main process is the relay (uid 0, only SETUID / SETGID), which starts the agent's
        command spawner here (the agent's --relay)."""
        name = handle.id + COMMANDS_SUFFIX  # _commands_container(handle) once the volumes are labelled
        binds = {vol: {"bind": path, "mode": "ro" if path == AGENT_DIR else "rw"} for path, vol in volumes.items()}
        host_config = api.create_host_config(
            binds=binds, nano_cpus=int(spec.cpus * 1e9), mem_limit=spec.memory_bytes,
            memswap_limit=spec.memory_bytes, pids_limit=spec.pids, network_mode=f"container:{handle.id}",
            pid_mode=f"container:{handle.id}", ipc_mode=f"container:{handle.id}", read_only=True,
            cap_drop=["ALL"], cap_add=["SETUID", "SETGID"],  # commands: agentrl's syscall policy, not Docker's
            security_opt=["no-new-privileges", "seccomp=unconfined"],
            ulimits=[Ulimit(name="core", soft=0, hard=0), Ulimit(name="nofile", soft=4096, hard=4096)],
            log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
        )
        return {"image": spec.image, "name": name, "user": "0:0", "working_dir": WORKSPACE,
                "command": ["python3", "-I", "-S", "-c", relay_source(), _relay_name(handle.id)],
                "labels": {**handle.labels, L_SANDBOX: handle.id, L_ROLE: "commands"},
                "environment": {"HOME": WORKSPACE}, "host_config": host_config}

    # ------------------------------------------------------------------ resource separation

    async def _separation(self, api: Any) -> limits.Limiter | None:
        """Decide once how the agent's resources are kept from the commands' (`self._mode`): "cgroups" (host cgroups;
        returns their limiter), "containers" (the agent in a container of its own) or "" (one budget: why is
        logged once)."""
        if not self._separation_checked:
            self._limiter, self._mode, why = await self._call(self._probe_separation, api)
            self._separation_checked = True
            if not self._mode:
                log.warning("DockerBackend: the agent and the commands of a container share its limits (%s)", why)
            elif why:
                log.info("DockerBackend: the agent gets a container of its own (%s)", why)
        return self._limiter

    def _probe_separation(self, api: Any) -> tuple[limits.Limiter | None, str, str]:
        if self.separation == "off":
            return None, "", "separation off (separate_resources=False)"
        if not self._root_host:
            return None, "", "not running as root: the commands cannot get a uid of their own"
        if self.separation == "containers":
            return None, "containers", ""
        limiter, why = self._probe_cgroups(api)
        if limiter is not None:
            return limiter, "cgroups", ""
        if self.separation == "auto":
            return None, "containers", f"no host cgroups: {why}"
        return None, "", why

    def _probe_cgroups(self, api: Any) -> tuple[limits.Limiter | None, str]:
        base_url = self._docker_host or os.environ.get("DOCKER_HOST") or "unix://"
        if not base_url.startswith(("unix://", "/")):
            return None, f"the Docker Engine at {base_url} is not local"
        try:
            info = api.info()
        except Exception as e:  # noqa: BLE001 - no separation then, the container still starts
            return None, f"docker info failed: {e}"
        driver, version = info.get("CgroupDriver"), str(info.get("CgroupVersion") or "1")
        if driver != "cgroupfs" or version != "1":
            return None, f"the engine uses the {driver} cgroup driver on cgroup v{version}; only cgroupfs on v1 is " \
                         "supported so far"
        try:
            limiter = limits.v1_at_root("agentrl-docker")
        except (OSError, ValueError) as e:
            return None, f"no writable cgroup v1 hierarchy for sandbox cgroups ({e})"
        rel = {_hierarchy_path(p) for p in limiter.parents}
        if len(rel) != 1 or None in rel:
            return None, f"the sandbox cgroups are not at one path in every hierarchy ({', '.join(limiter.parents)})"
        return limiter, ""

    def _separated_config(self, plan: limits.LimitPlan) -> tuple[dict, dict, list[str]]:
        """Host-config fields, extra binds and agent arguments of a resource-separated container."""
        parent = _hierarchy_path(plan.launch_cgroups[0])
        binds = {cg: {"bind": f"{CGROUP_MOUNT}/{i}", "mode": "rw"} for i, cg in enumerate(plan.cgroups)}
        args = ["--cgroups", "v1:" + ":".join(f"{CGROUP_MOUNT}/{i}" for i in range(len(plan.cgroups)))]
        return {"cgroup_parent": parent, "pids_limit": limits.AGENT_PIDS}, binds, args

    def _container_config(self, api: Any, handle: SandboxHandle, spec: SandboxSpec, sock_dir: Path,
                          volumes: dict[str, str] | None = None) -> dict:
        """The (agent's) container. `volumes` (two containers): its mounts are the shared tmpfs volumes and its
        limits the agent's own; the commands run in the other container (`_commands_config`)."""
        uid, gid = self._command_user.split(":")
        tmpfs_opts = f"size={spec.disk_bytes},uid={uid},gid={gid},mode=0755,exec"
        plan = self._plans.get(handle.id)
        if plan is not None:
            resources, extra_binds, agent_args = self._separated_config(plan)
        elif volumes is not None:
            memory = agent_container_memory(spec)
            resources = {"nano_cpus": int(AGENT_CONTAINER_CPUS * 1e9), "mem_limit": memory,
                         "memswap_limit": memory, "pids_limit": limits.AGENT_PIDS,
                         "ipc_mode": "shareable"}  # the commands' container joins it: one SysV namespace to clean
            extra_binds = {vol: {"bind": path, "mode": "rw"} for path, vol in volumes.items()}
            agent_args = ["--relay", _relay_name(handle.id)]
        else:
            resources = {"nano_cpus": int(spec.cpus * 1e9), "mem_limit": spec.memory_bytes,
                         "memswap_limit": spec.memory_bytes, "pids_limit": spec.pids}
            extra_binds, agent_args = {}, []
        tmpfs = {} if volumes is not None else {
            WORKSPACE: tmpfs_opts, "/tmp": f"size={spec.disk_bytes},mode=1777,exec",
            AGENT_DIR: f"size={AGENT_DIR_BYTES},mode=0755,exec",  # root's: agent.pyz bound inside, judge-python copied
            **{d: tmpfs_opts for d in spec.writable_dirs}}  # e.g. /repo: owned by the command user
        host_config = api.create_host_config(
            binds={str(self._agent_file): {"bind": AGENT_PATH, "mode": "ro"},
                   str(sock_dir): {"bind": SOCK_DIR, "mode": "rw"}, **extra_binds},
            tmpfs=tmpfs,
            **resources, network_mode=self._network if spec.network else "none",
            read_only=True, cap_drop=["ALL"], cap_add=AGENT_CAPS if self._root_host else None,
            # uid-separated, every command runs under agentrl's own syscall policy (the spawner's): Docker's default
            # profile would refuse some of its probes first, uncounted; without a spawner it stays the only one
            security_opt=["no-new-privileges", *(["seccomp=unconfined"] if self._root_host else [])], init=True,
            ulimits=[Ulimit(name="core", soft=0, hard=0), Ulimit(name="nofile", soft=4096, hard=4096)],
            log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
        )
        agent = ["python3", "-I", "-S", AGENT_PATH, "--unix", f"{SOCK_DIR}/agent.sock", "--workspace", WORKSPACE]
        if self._root_host:
            agent += ["--run-as", self._command_user]
        if spec.writable_dirs:
            agent += ["--writable", ":".join(spec.writable_dirs)]
        agent += agent_args
        command = ["python3", "-c", _TTL_EXEC, str(spec.ttl_s), *agent]
        return {"image": spec.image, "name": handle.id, "command": command,
                "user": "0:0" if self._root_host else self._command_user, "working_dir": WORKSPACE,
                "hostname": "sandbox", "labels": handle.labels,
                "environment": {"HOME": WORKSPACE}, "host_config": host_config}

    async def _wait_ready(self, handle: SandboxHandle, deadline: float) -> None:
        """Poll /health (a missing socket fails the connect at once) with a growing delay. Watches the container
        state about once a second so an agent that cannot start fails fast with its log, not at the deadline."""
        t0 = time.monotonic()
        delay, next_state = 0.002, t0 + 0.5
        while True:
            if await probe_health(handle.endpoint):
                handle.timings["agent_ready_s"] = time.monotonic() - t0
                return
            now = time.monotonic()
            if now >= next_state:
                next_state = now + 1.0
                await self._raise_if_exited(handle)
            if now >= deadline:
                raise SandboxStartError(f"agent in container {handle.id} did not answer within "
                                        f"{self._start_timeout_s:.0f}s; log: {await self._log_tail(handle)}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _raise_if_exited(self, handle: SandboxHandle) -> None:
        try:
            state = await self._state(handle)
        except requests.ConnectionError as e:  # dockerd went away while the container started (it died with it)
            raise SandboxEngineUnreachable(f"docker inspect {handle.id} failed while waiting for its agent: "
                                           f"{_why(e)}") from e
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxStartError(f"docker inspect {handle.id} failed while waiting for its agent: {_why(e)}") from e
        if state is not None and not state.get("Running"):
            raise SandboxStartError(f"container {handle.id} exited with {state.get('ExitCode')} before its agent "
                                    f"answered; log: {await self._log_tail(handle)}")

    async def _log_tail(self, handle: SandboxHandle) -> str:
        try:
            raw = await self._call((await self.api()).logs, handle.id, tail=20)
        except Exception as e:  # noqa: BLE001 - diagnostics only: never mask the original failure
            return f"<no log: {e}>"
        return raw.decode("utf-8", "replace").strip()[-2000:] or "<empty>"

    # ------------------------------------------------------------------ watch / remove

    async def _state(self, handle: SandboxHandle) -> dict[str, Any] | None:
        """The container's State from docker inspect; None when it does not exist."""
        try:
            info = await self._call((await self.api()).inspect_container, handle.id)
        except docker.errors.NotFound:
            return None
        return info.get("State") or {}

    async def alive(self, handle: SandboxHandle) -> bool:
        """Running per dockerd; when dockerd itself does not answer, whether the agent does."""
        try:
            state = await self._state(handle)
        except (docker.errors.DockerException, OSError, SandboxStartError):
            return await probe_health(handle.endpoint)
        return bool(state and state.get("Running") and not state.get("Restarting"))

    async def death_cause(self, handle: SandboxHandle) -> str | None:
        """From docker inspect: "deleted" (no such container, or being removed), "oom" (the kernel OOM-killed the
        container's agent: OOMKilled with a SIGKILL exit), "killed:9" (uid-separated: a SIGKILL sent through the
        engine, `docker kill`, as its kill event records, and no OOM event), SIGKILL_UNPROVEN (uid-separated: a
        SIGKILL exit with neither record: the OOM killer unflagged, or a kill on the host), "killed:15"
        (uid-separated: the agent ended on SIGTERM, `docker stop` or dockerd shutting down), "signal:<n>" (exit code
        128+n, as docker-init reports a signalled agent), "exited:<code>",
        "engine_lost" (dockerd refuses or drops the connection: it stopped or is restarting); None while it still
        runs after DEATH_SETTLE_S, or when dockerd answers with an error."""
        deadline = time.monotonic() + DEATH_SETTLE_S
        while True:  # dockerd records the exit a moment after the agent's socket broke: wait for it to settle
            try:
                state = await self._state(handle)
            except (requests.ConnectionError, SandboxStartError) as e:
                # the engine's socket refuses or drops connections: dockerd stopped (a restart kills its containers
                # unless live-restore is on). No command reaches the socket, so this is the sandbox's outside cause.
                log.warning("docker inspect %s: the Docker Engine does not answer (%s)", handle.id, e)
                return "engine_lost"
            except (docker.errors.DockerException, requests.RequestException, OSError) as e:
                log.warning("docker inspect %s failed: %s", handle.id, e)
                return None
            cause = container_death_cause(state, uid_separated=self._root_host)
            if cause == SIGKILL_UNPROVEN:
                cause = container_death_cause(state, uid_separated=True, engine_kill=await self._engine_kill(handle))
            if cause is not None or time.monotonic() >= deadline:
                return cause
            await asyncio.sleep(0.1)

    async def _engine_kill(self, handle: SandboxHandle) -> bool:
        """The engine's events since the container was created show a SIGKILL sent to it through the API and no OOM
        of it: the positive record that its SIGKILL came from outside. False when they do not, or cannot be read
        (the engine keeps a bounded backlog of events: a record gone from it proves nothing either)."""
        since = int(float(handle.labels.get(L_CREATED, "0"))) - 1
        until = f"{time.time():.9f}"
        filters = {"container": handle.id, "type": "container", "event": ["kill", "oom"]}
        try:
            api = await self.api()
            events = await self._call(lambda: list(api.events(since=since, until=until, filters=filters,
                                                              decode=True)))
        except (docker.errors.DockerException, requests.RequestException, OSError) as e:
            log.warning("docker events %s failed: %s", handle.id, e)
            return False
        actions = [(e.get("Action") or e.get("status"), (e.get("Actor") or {}).get("Attributes") or {}) for e in events]
        if any(action == "oom" for action, _ in actions):
            return False
        return any(action == "kill" and str(attrs.get("signal")).upper() in ("9", "SIGKILL", "KILL")
                   for action, attrs in actions)

    async def oom_kills(self, handle: SandboxHandle) -> int:
        """How many times the kernel's OOM killer fired in this container's cgroup since it was created (Docker
        'oom' events; resource-separated: the kernel's count in the `commands` cgroup, where the limit is). A command
        that died with SIGKILL (exit code -9 / 137) was killed for memory when this grew."""
        plan = self._plans.get(handle.id)
        if plan is not None:
            return await self._call(limits.oom_kills, plan.command_cgroups)
        api = await self.api()
        since = int(float(handle.labels.get(L_CREATED, "0"))) - 1
        until = f"{time.time():.9f}"  # seconds.nanoseconds: a whole-second 'until' in the future would block
        filters = {"container": _commands_container(handle) or handle.id, "event": "oom", "type": "container"}
        events = await self._call(lambda: list(api.events(since=since, until=until, filters=filters, decode=True)))
        return len(events)

    async def destroy(self, handle: SandboxHandle) -> None:
        """Remove the container (SIGKILL, no grace: the trajectory is over) and its socket dir. Idempotent.
        When dockerd cannot remove it now, the next create() and close() try again."""
        commands = _commands_container(handle)
        try:
            if commands:
                await self._remove(commands)
            await self._remove(handle.id)
            if commands:
                await self._call(self._remove_volumes, await self.api(), handle.labels[L_VOLUMES].split(":"))
        except BaseException:
            self._unremoved.add(handle.id)
            raise
        self._live.pop(handle.id, None)
        self._unremoved.discard(handle.id)
        await self._call(self._remove_sock_dir, handle.labels.get(L_SOCK))
        plan = self._plans.pop(handle.id, None)
        if plan is not None:
            await self._call(limits.remove_cgroups, plan.cgroups)

    async def _retry_removals(self) -> None:
        for name in list(self._unremoved):
            handle = self._live.get(name)
            try:
                if handle is not None:
                    await self.destroy(handle)
                else:
                    self._unremoved.discard(name)
            except Exception as e:  # noqa: BLE001 - retried later; must not fail the create that called it
                log.warning("sandbox %s still not removed: %s", name, e)
                return  # dockerd is still unhappy: try again next time
            log.info("removed sandbox %s on retry", name)

    async def _discard(self, handle: SandboxHandle) -> None:
        """Best-effort removal after a failed or cancelled create (the original error is what matters)."""
        try:
            await self.destroy(handle)
        except Exception as e:  # noqa: BLE001 - the create's own error is what propagates
            log.warning("could not remove half-created sandbox %s: %s (agentrl sandbox gc removes it)", handle.id, e)

    async def _remove(self, container: str) -> None:
        api = await self.api()
        try:
            await self._call(api.remove_container, container, force=True, v=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as e:
            if e.status_code == 409 and "already in progress" in str(e.explanation):
                return
            raise SandboxError(f"docker rm -f {container} failed: {e.explanation or e}") from e
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker rm -f {container} failed: dockerd unreachable ({e})") from e

    def _remove_volumes(self, api: Any, names: list[str]) -> None:
        """Remove a sandbox's volumes (two containers), only names of ours (a label is data)."""
        for name in names:
            if not name.startswith("agentrl-"):
                continue
            try:
                api.remove_volume(name, force=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as e:
                raise SandboxError(f"docker volume rm {name} failed: {e.explanation or e}") from e
            except (docker.errors.DockerException, requests.RequestException) as e:
                raise SandboxError(f"docker volume rm {name} failed: dockerd unreachable ({e})") from e

    def _sweep_volumes(self, api: Any, live: set[str], now: float) -> None:
        """Volumes of sandboxes whose containers are gone (two containers) and that are old enough not to belong to
        a create in progress: removed (one still in use is refused by dockerd and kept)."""
        found = (api.volumes(filters={"label": f"{L_OWNER}={OWNER}"}) or {}).get("Volumes") or []
        for v in found:
            sandbox = (v.get("Labels") or {}).get(L_SANDBOX, "")
            try:
                age = now - datetime.fromisoformat(str(v.get("CreatedAt"))).timestamp()
            except ValueError:
                age = STALE_DIR_S + 1
            if sandbox not in live and age > STALE_DIR_S:
                try:
                    self._remove_volumes(api, [v["Name"]])
                except SandboxError as e:  # still in use (a create in progress holds it): the next sweep
                    log.info("sweep: volume %s not removed: %s", v["Name"], e)

    def _remove_sock_dir(self, path: str | None) -> None:
        """Remove a socket dir, but only one of ours (a label is data, not a path to trust blindly)."""
        if not path:
            return
        target = Path(path)
        if target.parent == self._socket_root and target.name.startswith("agentrl-"):
            shutil.rmtree(target, ignore_errors=True)

    async def sweep(self, *, run_id: str | None = None, all_runs: bool = False) -> int:
        """Remove agentrl containers and return how many: with neither argument, orphans (TTL passed, or owner
        process on this host gone); with `run_id`, every container of that run; with `all_runs`, every one."""
        api = await self.api()
        await self._separation(api)  # where this host keeps sandbox cgroups (to remove those of the removed)
        found = await self._call(api.containers, all=True, filters={"label": f"{L_OWNER}={OWNER}"})
        now = time.time()
        doomed = [c for c in found if should_remove(c.get("Labels") or {}, now=now, host=self._host,
                                                    run_id=run_id, all_runs=all_runs)]
        results = await asyncio.gather(*(self._remove(c["Id"]) for c in doomed), return_exceptions=True)
        removed = 0
        for c, result in zip(doomed, results):
            if isinstance(result, BaseException):
                log.warning("sweep: could not remove container %s: %s", c["Id"][:12], result)
                continue
            removed += 1
            await self._call(self._remove_sock_dir, (c.get("Labels") or {}).get(L_SOCK))
            await self._call(self._remove_cgroups, (c.get("Labels") or {}).get(L_CGROUPS))
        live = {n.lstrip("/") for c in found if c not in doomed for n in c.get("Names") or []}
        await self._call(self._sweep_stale_dirs, live, now)
        await self._call(self._sweep_volumes, api, live | set(self._live), now)
        return removed

    def _remove_cgroups(self, joined: str | None) -> None:
        """Remove a sandbox's host cgroups named by its label, but only directories of ours (a label is data)."""
        if not joined or self._limiter is None:
            return
        ours = [d for d in joined.split(":") if Path(d).parent.as_posix() in self._limiter.parents
                and Path(d).name.startswith("agentrl-")]
        limits.remove_cgroups(ours)

    def _sweep_stale_dirs(self, live: set[str], now: float) -> None:
        """Socket dirs whose container is gone (removed outside agentrl) and that are old enough not to belong
        to a create in progress."""
        for parent in self._limiter.parents if self._limiter is not None else ():
            for d in Path(parent).glob("agentrl-*"):
                try:
                    stale = d.name not in live and now - d.lstat().st_mtime > STALE_DIR_S
                except OSError:
                    continue
                if stale:
                    limits.remove_cgroups([str(d)])
        if not self._socket_root.is_dir():
            return
        for d in self._socket_root.iterdir():
            try:
                stale = d.name not in live and now - d.lstat().st_mtime > STALE_DIR_S
            except OSError:
                continue
            if stale:
                self._remove_sock_dir(str(d))

    async def close(self) -> None:
        """Destroy every sandbox this object created and has not destroyed yet, then close the API client and
        stop the thread pool."""
        live = list(self._live.values())
        results = await asyncio.gather(*(self.destroy(h) for h in live), return_exceptions=True)
        for handle, result in zip(live, results):
            if isinstance(result, BaseException):
                log.warning("could not remove sandbox %s on close: %s (agentrl sandbox gc removes it)",
                            handle.id, result)
        api, self._api = self._api, None
        if api is not None:
            await self._call(api.close)
        await asyncio.to_thread(self._threads.shutdown, wait=True)
