"""LocalBackend ("local"): one in-sandbox agent process per sandbox, isolated with bubblewrap.

Owns: starting the agent under bubblewrap and waiting for its ready line, per-sandbox state files (owner pid, run
id, created-at, TTL) under a state root, the judge's execute-only interpreter, destroying sandboxes (idempotent) and
sweeping orphans (the rule: `ownership.py`). The bubblewrap command line (namespaces, read-only system binds,
private tmpfs workspace and /tmp) is built by `bubblewrap.py`; limits come from `limits.py`. Does not own: commands
or files inside the sandbox (the agent, via client.py) or leasing (pool.py).

Each sandbox gets `<state root>/<id>/` on the host:

    state.json   owner pid + its start time, run id, labels, created_at, ttl_s, pid of bwrap, cgroups
    run/         bound at /.agentrl/run inside; holds the agent's unix socket agent.sock
    agent.log    stderr of bwrap and the agent (read back when a start fails)
    passwd,group bound read-only over /etc/passwd and /etc/group (uid 1000 "agent")

and, uid-separated, one `<state root>/judge-python` for all of them: a copy of the sandbox's python3, root's, mode
0111, bound read-only at /.agentrl/judge-python (`Sandbox.judge_python`): the command user can run it but not read
it, so the kernel makes every process started from it non-dumpable at its execve (graders run on it).

Inside: new pid/net/ipc/uts/mount namespaces, read-only /usr (and /bin, /lib* links), a few files of /etc, a
size-limited tmpfs at /workspace, /tmp and /dev/shm (and at each of `spec.writable_dirs`, e.g. /repo, which the
agent gives to the sandbox user), minimal /dev and /proc; no /root, /home, /work or other host
directories unless `ro_binds` names them. Killing bwrap (our child) kills the sandbox's pid namespace
(--die-with-parent); cgroups catch the rest. Who runs as whom depends on the host user:

    host root   uid separation (`uid_separated`): no user namespace; the agent runs as uid 0 with only CAP_CHOWN,
                CAP_KILL, CAP_SETGID, CAP_SETUID (bwrap --cap-drop ALL --cap-add ...) and no_new_privs, and starts
                every command as uid/gid 1000 (`--run-as`), which can neither signal, ptrace nor read the agent nor
                enter run/ (root, 0700). Commands are host uid 1000 confined to the sandbox's namespaces; they may
                still create user namespaces of their own (bwrap's --disable-userns needs --unshare-user).
    other       one uid: a fresh user namespace maps the host user to uid/gid 1000, and the agent and its commands
                share it, so a command can kill or trace the agent (`uid_separated: false`; warned once per backend)

Resource separation (`resources_separated`: uid-separated and cgroup limits): the sandbox's cgroup has an `agent`
child (bubblewrap, the agent) and a `commands` child with the spec's memory / pids / CPU limits (limits.py), bound
at /.agentrl/cgroup/<n> (0700, root) so that the agent starts every command in `commands` and kills through it;
the IPC namespace is private (--unshare-ipc) and /kill_all removes its SysV objects. Without it (rlimits only, or
one uid) the agent and the commands share one budget: `resources_separated: false` in the agent's /health, and a
death of such a sandbox is the policy's to answer for.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError, MissingDependencyError, SandboxStartError
from agentrl.sandbox import limits
from agentrl.sandbox.agent.protocol import READY_LINE
from agentrl.sandbox.artifact import shipped
from agentrl.sandbox.base import SIGKILL_UNPROVEN, AgentEndpoint, SandboxHandle, SandboxSpec
from agentrl.sandbox.bubblewrap import SANDBOX_UID, WORKSPACE, Bubblewrap
from agentrl.sandbox.ownership import alive as process_alive
from agentrl.sandbox.ownership import host_id, owner_gone, process_start, sweep_selects, ttl_passed

log = logging.getLogger("agentrl.sandbox")

ORPHAN_DIR_AGE_S = 120.0  # a sandbox dir without a state file older than this is debris of a crashed start
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap)"


@dataclass
class _Live:
    """A sandbox started by this backend object."""

    proc: asyncio.subprocess.Process
    path: Path
    plan: limits.LimitPlan


def _same_copy(copy: Path, original: os.stat_result) -> bool:
    """`copy` is root's execute-only copy of the file `original` describes (same size and modification time)."""
    try:
        st = copy.stat()
    except FileNotFoundError:
        return False
    return (st.st_uid == 0 and st.st_mode & 0o7777 == 0o111 and st.st_size == original.st_size
            and st.st_mtime_ns == original.st_mtime_ns)


def default_state_root() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime, "agentrl-sandboxes")
    return Path(tempfile.gettempdir(), f"agentrl-sandboxes-{os.geteuid()}")


class LocalBackend:
    """Sandboxes as bubblewrap-isolated local processes. See the module docstring for the layout."""

    name = "local"

    def __init__(self, *, state_dir: str | os.PathLike[str] | None = None, unsafe_no_isolation: bool = False,
                 bwrap: str = "bwrap", search_path: str | None = None, python: str | None = None,
                 ro_binds: Sequence[str] = (), share_host_python: bool = False, limits_mode: str = "auto",
                 start_timeout_s: float = 30.0, separate_resources: bool = True) -> None:
        if limits_mode not in limits.MODES:
            raise ConfigError(f"limits_mode={limits_mode!r}: choose one of {', '.join(limits.MODES)}")
        self.state_root = Path(state_dir) if state_dir is not None else default_state_root()
        self.unsafe = unsafe_no_isolation
        self.bwrap = shutil.which(bwrap, path=search_path)
        if self.bwrap is None and not self.unsafe:
            raise MissingDependencyError(
                f"bubblewrap ({bwrap!r}) not found on PATH: {INSTALL_HINT}, or create the backend with "
                "unsafe_no_isolation=True to run sandboxes as plain processes (no isolation at all)")
        if self.unsafe:
            log.warning("LocalBackend(unsafe_no_isolation=True): sandboxes are PLAIN PROCESSES on this host with "
                        "full access to its files and network. Use only for trusted code.")
        # uid separation needs a second uid, hence real root (a user namespace of an unprivileged user maps one uid)
        self.uid_separated = not self.unsafe and os.geteuid() == 0
        if not self.uid_separated and not self.unsafe:
            log.warning("LocalBackend: not running as root, so sandboxes run the agent and its commands under ONE uid "
                        "(uid_separated=false): a command can kill or trace its sandbox's agent. Run as root, or use "
                        "the docker / kubernetes backend, where commands run under a uid of their own.")
        self.python = python or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
        self.ro_binds = tuple(str(Path(p).resolve()) for p in ro_binds)
        self.path_prepend: tuple[str, ...] = ()
        if share_host_python:
            self.ro_binds += (str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve()))
            self.path_prepend = (str(Path(sys.prefix).resolve() / "bin"),)
        self.start_timeout_s = start_timeout_s
        self.separate_resources = separate_resources  # False: the old shared budget (benchmarks compare the two)
        self._limits_mode = limits_mode
        self._limiter: limits.Limiter | None = None
        self._limiter_lock = threading.Lock()  # detection runs in worker threads (blocking cgroupfs I/O)
        self._live: dict[str, _Live] = {}
        self._agent_file = str(shipped())  # the agent's artifact (artifact.py), bound read-only into each sandbox
        self._judge_python: str | None = None  # made by the first _prepare (uid-separated only)
        self._judge_lock = threading.Lock()
        if len(str(self.state_root / ("0" * 12) / "run" / "agent.sock")) > 100:
            raise ConfigError(f"state_dir {self.state_root} is too long for a unix socket path (108 bytes): "
                              "pass a shorter state_dir")

    # ------------------------------------------------------------ properties

    @property
    def limiter(self) -> limits.Limiter:
        with self._limiter_lock:
            if self._limiter is None:
                self._limiter = limits.detect(self._limits_mode)
            return self._limiter

    @property
    def limits_mode(self) -> str:
        return self.limiter.mode

    @property
    def enforces_pids(self) -> bool:
        return self.limiter.enforces_pids

    @property
    def resources_separated(self) -> bool:
        """Commands get a cgroup of their own with the limits, the agent and bubblewrap stay outside it."""
        return self.separate_resources and self.uid_separated and self.limiter.can_separate

    # ------------------------------------------------------------ create

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> SandboxHandle:
        """Start one sandbox; return once its agent listens (it printed its ready line)."""
        if self.unsafe and spec.writable_dirs:
            raise ConfigError(f"sandbox spec writable_dirs={list(spec.writable_dirs)} needs isolation (bubblewrap): "
                              "a plain process cannot get its own directories at those paths; drop "
                              "unsafe_no_isolation")
        sid = uuid.uuid4().hex[:12]
        path = self.state_root / sid
        t0 = time.monotonic()
        plan: limits.LimitPlan | None = None
        proc: asyncio.subprocess.Process | None = None
        # a thread cannot be cancelled: if this call is, wait for _prepare to finish before tearing down, or the
        # thread would recreate the state dir after the teardown removed it
        prep = asyncio.ensure_future(asyncio.to_thread(self._prepare, sid, path, spec, labels))
        try:
            ready, log_fd = await asyncio.shield(prep)
            plan = ready
            try:
                proc = await self._spawn(ready.wrap(self._argv(spec, path, ready)), path, log_fd)
            finally:
                os.close(log_fd)
            self._live[sid] = _Live(proc, path, ready)
            t1 = time.monotonic()
            await asyncio.to_thread(self._record_pid, path, proc.pid)
            await self._wait_ready(sid, proc, path)
        except BaseException as e:
            if plan is None:
                plan = await self._settle_prepare(prep)
            await asyncio.shield(self._teardown(sid, path, plan, proc))
            if isinstance(e, (OSError, asyncio.TimeoutError)):
                raise SandboxStartError(f"sandbox {sid} failed to start: {type(e).__name__}: {e}") from e
            raise
        t2 = time.monotonic()
        endpoint = AgentEndpoint(kind="unix", address=str(path / "run" / "agent.sock"))
        return SandboxHandle(id=sid, backend=self.name, endpoint=endpoint, labels=dict(labels),
                             timings={"create_s": t1 - t0, "start_s": t2 - t1, "agent_ready_s": t2 - t0})

    @staticmethod
    async def _settle_prepare(prep: asyncio.Future[tuple[limits.LimitPlan, int]]) -> limits.LimitPlan | None:
        """Let an interrupted _prepare thread finish; return its plan (closing its log fd) for the teardown."""
        while not prep.done():
            try:
                await asyncio.shield(prep)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        if prep.cancelled() or prep.exception() is not None:
            return None
        plan, log_fd = prep.result()
        os.close(log_fd)
        return plan

    def _prepare(self, sid: str, path: Path, spec: SandboxSpec, labels: dict[str, str]) -> tuple[limits.LimitPlan, int]:
        self.state_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        (path / "run").mkdir(mode=0o700)
        if self.unsafe:
            (path / "workspace").mkdir(mode=0o700)
        (path / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nagent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:"
                                     f"{WORKSPACE}:/bin/sh\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n")
        (path / "group").write_text(f"root:x:0:\nagent:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        state = {"id": sid, "backend": self.name, "owner_pid": os.getpid(), "owner_start": process_start(os.getpid()),
                 "owner_host": host_id(), "run_id": labels.get("agentrl/run-id"), "labels": labels,
                 "created_at": time.time(), "ttl_s": spec.ttl_s, "pid": None, "pid_start": None,
                 "cgroups": [], "unsafe": self.unsafe}
        self._write_state(path, state)  # before any process exists, so a crash from here on is sweepable
        self._ensure_judge_python()
        plan = self.limiter.prepare(sid, spec, separate=self.resources_separated)
        self._write_state(path, {**state, "cgroups": list(plan.cgroups), "limits": plan.mode})
        return plan, os.open(path / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _ensure_judge_python(self) -> None:
        """Copy the sandbox's python3 to `<state root>/judge-python` (root's, 0111; kept while python3 is unchanged).
        A real copy: a link would share the original's inode and mode. Nothing when not uid-separated, when python3
        is a venv's (its copy would lose the venv) or when the copy fails: graders then fall back (python3)."""
        with self._judge_lock:
            if self._judge_python is not None or not self.uid_separated:
                return
            self._judge_python = ""
            src = shutil.which("python3", path=self._env(WORKSPACE)["PATH"])
            if src is None or any((Path(src).parent / up / "pyvenv.cfg").exists() for up in (".", "..")):
                log.warning("LocalBackend: no execute-only interpreter for graders (python3 %s): they turn "
                            "non-dumpable after their start-up instead", "is a venv's" if src else "not found")
                return
            dst = self.state_root / "judge-python"
            tmp = self.state_root / f".judge-python.{uuid.uuid4().hex[:8]}"
            try:
                real = os.stat(os.path.realpath(src))
                if not _same_copy(dst, real):  # one copy per state root, made again when python3 changed
                    shutil.copyfile(os.path.realpath(src), tmp)
                    os.chown(tmp, 0, 0)
                    os.chmod(tmp, 0o111)
                    os.utime(tmp, ns=(real.st_atime_ns, real.st_mtime_ns))
                    tmp.replace(dst)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                log.warning("LocalBackend: cannot make the execute-only interpreter for graders (%s): they turn "
                            "non-dumpable after their start-up instead", e)
                return
            self._judge_python = str(dst)

    @staticmethod
    def _write_state(path: Path, state: dict) -> None:
        tmp = path / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(path / "state.json")

    def _record_pid(self, path: Path, pid: int) -> None:
        state = json.loads((path / "state.json").read_text())
        self._write_state(path, {**state, "pid": pid, "pid_start": process_start(pid)})

    def _command(self) -> Bubblewrap:
        """The command line's view of this backend (settings as they are now: the judge's copy is made lazily)."""
        return Bubblewrap(bwrap=self.bwrap, python=self.python, agent_file=self._agent_file, unsafe=self.unsafe,
                          uid_separated=self.uid_separated, ro_binds=self.ro_binds, path_prepend=self.path_prepend,
                          judge_python=self._judge_python)

    def _argv(self, spec: SandboxSpec, path: Path, plan: limits.LimitPlan | None = None) -> list[str]:
        return self._command().argv(spec, path, plan)

    def _env(self, home: str) -> dict[str, str]:
        return self._command().env(home)

    async def _spawn(self, argv: list[str], path: Path, log_fd: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log_fd,
            start_new_session=True, cwd=str(path), env=self._env(str(path / "workspace")))

    async def _wait_ready(self, sid: str, proc: asyncio.subprocess.Process, path: Path) -> None:
        assert proc.stdout is not None  # spawned with stdout=PIPE
        try:
            async with asyncio.timeout(self.start_timeout_s):
                line = await proc.stdout.readline()
        except TimeoutError:
            raise SandboxStartError(
                f"sandbox {sid}: agent not ready within {self.start_timeout_s}s; log: {self._log_tail(path)}") from None
        if line.decode(errors="replace").strip() != READY_LINE:
            await proc.wait()
            raise SandboxStartError(f"sandbox {sid} exited during start (code {proc.returncode}): "
                                    f"{self._log_tail(path)}")

    @staticmethod
    def _log_tail(path: Path) -> str:
        try:
            return (path / "agent.log").read_text(errors="replace")[-2000:].strip() or "(empty)"
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------ destroy / alive

    async def destroy(self, handle: SandboxHandle) -> None:
        """Kill the sandbox's processes and remove its cgroups and directory. Idempotent."""
        live = self._live.get(handle.id)
        if live is None:
            await asyncio.to_thread(self._reap_foreign, self.state_root / handle.id)
            return
        await self._teardown(handle.id, live.path, live.plan, live.proc)

    async def _teardown(self, sid: str, path: Path, plan: limits.LimitPlan | None,
                        proc: asyncio.subprocess.Process | None) -> None:
        if proc is not None and proc.returncode is None:
            await self._kill(proc)
        self._live.pop(sid, None)
        cgroups = plan.cgroups if plan is not None else ()
        await asyncio.to_thread(self._remove, path, cgroups)

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        if self.unsafe:  # the agent's commands run in their own sessions: let it kill them first
            proc.terminate()
            try:
                async with asyncio.timeout(1.0):
                    await proc.wait()
                return
            except TimeoutError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()

    @staticmethod
    def _remove(path: Path, cgroups: Sequence[str]) -> None:
        limits.remove_cgroups(list(cgroups))
        shutil.rmtree(path, ignore_errors=True)

    def _reap_foreign(self, path: Path) -> None:
        """Destroy a sandbox this object did not start, from its state file."""
        try:
            state = json.loads((path / "state.json").read_text())
        except (OSError, ValueError):
            state = {}
        pid, start = state.get("pid"), state.get("pid_start")
        if process_alive(pid, start):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._remove(path, state.get("cgroups") or [])

    async def alive(self, handle: SandboxHandle) -> bool:
        live = self._live.get(handle.id)
        if live is not None:
            return live.proc.returncode is None
        state = await asyncio.to_thread(self._read_state, self.state_root / handle.id)
        return state is not None and process_alive(state.get("pid"), state.get("pid_start"))

    async def death_cause(self, handle: SandboxHandle) -> str | None:
        """Why the sandbox is gone, as far as this host can prove: "deleted" (its state dir was removed from outside,
        e.g. by a sweep), "killed:<n>" (bubblewrap itself was signalled from the host), "oom" (bubblewrap or its
        agent died of SIGKILL and the kernel OOM-killed in the cgroup they share with the commands), "killed:oom"
        (resource-separated: the OOM killer took the agent in its own cgroup, which the commands cannot fill),
        "signal:<n>" / "exited:<code>" (how the agent ended, which bubblewrap mirrors); None while it runs or when
        unknown."""
        if not await asyncio.to_thread((self.state_root / handle.id).is_dir):
            return "deleted"
        live = self._live.get(handle.id)
        if live is None:
            return None
        if live.proc.returncode is None:
            try:  # the agent just died: bwrap (pid 1 of the sandbox, then its monitor) follows within milliseconds
                async with asyncio.timeout(1.0):
                    await live.proc.wait()
            except TimeoutError:
                return None
        code = live.proc.returncode
        if code is None:  # still running after the settle time: no cause yet
            return None
        plan = live.plan
        if code < 0:  # bubblewrap itself was signalled: it is a host process outside the sandbox's pid namespace, no
            # command can see or signal it, so this came from outside (host, admin, OOM) -- unless it shares the
            # commands' memory cgroup and that cgroup's OOM killer took it: then the commands' memory did it
            if code == -signal.SIGKILL and not plan.separated:
                kills = await self._oom_kills(plan.cgroups)
                if kills is None and plan.cgroups:
                    return SIGKILL_UNPROVEN  # the cgroup's counter is unreadable: it may have been the OOM killer
                if kills:
                    return "oom"
            return f"killed:{-code}"
        signum = code - 128 if code > 128 else None  # bwrap reports its child's death by signal n as 128 + n
        if signum == signal.SIGKILL:
            # a SIGKILL is from outside only when the kernel's counter of the cgroup the agent lives in says the OOM
            # killer did not fire; an unreadable counter proves nothing (SIGKILL_UNPROVEN: attribution decides)
            kills = await self._oom_kills(plan.launch_cgroups if plan.separated else plan.cgroups)
            if kills and plan.separated:
                return "killed:oom"  # the OOM killer took the agent in its own cgroup: host memory, not the commands'
            if kills:
                return "oom"
            if kills is None and plan.cgroups:
                return SIGKILL_UNPROVEN
        return f"signal:{signum}" if signum is not None else f"exited:{code}"

    @staticmethod
    async def _oom_kills(cgroups: Sequence[str]) -> int | None:
        return await asyncio.to_thread(limits.oom_kills_known, tuple(cgroups))

    @staticmethod
    def _read_state(path: Path) -> dict | None:
        try:
            return json.loads((path / "state.json").read_text())
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------ sweep / close

    async def sweep(self, *, run_id: str | None = None, all_runs: bool = False) -> int:
        """Remove sandboxes under the state root and return how many: with neither argument, orphans (owner process
        dead, or TTL passed); with `run_id`, every sandbox of that run; with `all_runs`, every sandbox."""
        victims = await asyncio.to_thread(self._victims, run_id, all_runs)
        for sid in victims:
            live = self._live.get(sid)
            if live is not None:
                await self._teardown(sid, live.path, live.plan, live.proc)
            else:
                await asyncio.to_thread(self._reap_foreign, self.state_root / sid)
        if victims:
            log.info("swept %d sandbox(es) from %s", len(victims), self.state_root)
        return len(victims)

    def _victims(self, run_id: str | None, all_runs: bool) -> list[str]:
        if not self.state_root.is_dir():
            return []
        now = time.time()
        out = []
        for path in self.state_root.iterdir():
            if not path.is_dir():
                continue
            state = self._read_state(path)
            if state is None:
                if now - path.stat().st_mtime > ORPHAN_DIR_AGE_S:
                    out.append(path.name)
                continue
            if sweep_selects(run=state.get("run_id"), run_id=run_id, all_runs=all_runs,
                             orphaned=functools.partial(self._orphaned, state, now)):
                out.append(path.name)
        return out

    @staticmethod
    def _orphaned(state: dict, now: float) -> bool:
        """The ownership rule wired to a state file (a missing creation time or TTL counts as 0, as it always has).
        A state root shared across hosts: only the TTL applies to another host's sandboxes."""
        return (ttl_passed(state.get("created_at", 0), state.get("ttl_s", 0), now)
                or owner_gone(state.get("owner_host"), state.get("owner_pid"), state.get("owner_start")))

    async def close(self) -> None:
        """Destroy every sandbox this backend started and has not destroyed yet."""
        for sid, live in list(self._live.items()):
            await self._teardown(sid, live.path, live.plan, live.proc)
