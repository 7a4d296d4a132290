"""`Agent`: the request handlers (/health, /exec, /kill_all, PUT and GET /file) and what they share: the command
user (`Identity`), the `commands` cgroup, the spawner, the reaper, the policy's watchers and the resource counters."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import stat
import sys
import threading
import time

from .bodies import BodyStream, FileBody
from .cgroups import CommandCgroup, ResourceCounters
from .identity import Identity, remove_sysv_ipc
from .kill import KILL_ALL_DEADLINE_S, fork_kill_all_as, kill_all_as, kill_group, kill_pids, kill_until_gone
from .paths import open_regular, resolve_in_workspace
from .process import DRAIN_AFTER_KILL_S, EXIT_GRACE_S, ExecRun, Proc, prefer_oom_kill
from .procfs import boot_ticks, command_user_pids, descendants
from .protocol import (
    DEFAULT_OUTPUT_LIMIT,
    EXEC,
    FILE,
    HEALTH,
    KILL_ALL,
    KIND_BAD_PATH,
    KIND_NO_ROUTE,
    KIND_TOO_LARGE,
    MAX_OUTPUT,
    VERSION,
    HTTPError,
)
from .reaper import Reaper
from .spawner import (
    SECCOMP_POLICY,
    STATUS_GRACE_S,
    GoneBefore,
    Spawner,
    SpawnerLost,
    SpawnerUnusable,
)
from .watch import NetAttempts, SeccompWatch, SignalTargets


def agent_home() -> str:
    """The directory the agent was shipped into: the artifact's (`DIR/agent.pyz`, this module is
    `DIR/agent.pyz/agent/handlers.py`), or, run from the source tree, the package's parent directory."""
    outer = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.dirname(outer) if os.path.isfile(outer) else outer


def judge_python(identity: Identity) -> str | None:
    """`judge-python` next to the agent (`agent_home()`) when the command user can execute it but not read it (see
    /health)."""
    path = os.path.join(agent_home(), "judge-python")
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not identity.separated or not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
        return None
    with identity.files():  # the command user's view (fsuid; X_OK also fails on a noexec mount)
        usable = os.access(path, os.X_OK, effective_ids=True) and not os.access(path, os.R_OK, effective_ids=True)
    return path if usable else None


class Agent:
    """Request handlers. Tracks the process groups it started (for timeouts and shutdown) and reaps every child
    (`Reaper`)."""

    def __init__(self, workspace: str, identity: Identity | None = None, writable: tuple[str, ...] = (),
                 cgroup: CommandCgroup | None = None, libc: ctypes.CDLL | None = None, *,
                 exit_grace_s: float = EXIT_GRACE_S, relay: str | None = None) -> None:
        self.workspace = os.path.realpath(workspace)
        self.exit_grace_s = exit_grace_s
        self.writable = tuple(os.path.realpath(d) for d in writable)
        self.identity = identity or Identity(None)
        self.cgroup = cgroup or CommandCgroup(None)
        self._libc = libc
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._reaper = Reaper()
        self._kill_lock = threading.Lock()
        self.relay = relay  # commands run in another container: only through the relay's spawner
        self.judge_python = judge_python(self.identity)  # the backend put it there before the agent started
        self.counters = ResourceCounters(self.cgroup, (self.workspace, *self.writable))
        # separated (by uid, by cgroup or by container): commands start through a fork server that is already where
        # they belong
        separated = self.identity.separated or self.cgroup.enabled or relay
        self._targets = SignalTargets(self.identity)
        self._watch = SeccompWatch(self._targets) if separated and SECCOMP_POLICY == "notify" else None
        self._net = NetAttempts()
        self._spawner = Spawner(self.identity, self.cgroup, self._reaper, relay, self._watch) if separated else None
        if self._spawner is not None and relay:
            self._spawner.on_counter_files = self.counters.use_files

    def dispatch(self, method: str, path: str, body: bytes | bytearray | BodyStream) -> dict | FileBody:
        route, _, query = path.partition("?")
        if route == FILE and method in ("GET", "PUT"):
            req = _query(query)
            return self.read(req) if method == "GET" else self.write(req, body)
        routes = {("GET", HEALTH): self.health, ("POST", EXEC): self.exec, ("POST", KILL_ALL): self.kill_all}
        handler = routes.get((method, route))
        if handler is None:
            raise HTTPError(404 if method in ("GET", "POST", "PUT") else 405, f"no route {method} {path[:200]}",
                            KIND_NO_ROUTE)
        req = _json_body(body) if method == "POST" and not isinstance(body, BodyStream) else {}
        return handler(req)

    def health(self, req: dict) -> dict:
        return {"ok": True, "pid": os.getpid(), "version": VERSION, "workspace": self.workspace,
                "writable": list(self.writable),
                "uid_separated": self.identity.separated, "command_uid": self.identity.uid,
                "resources_separated": self.cgroup.enabled or self.relay is not None,
                "commands_apart": self.relay is not None, "judge_python": self.judge_python,
                "seccomp": self._seccomp_mode()}

    def _seccomp_mode(self) -> str:
        """The syscall policy commands run under: notify (refusals counted), errno (refused, not counted), or
        "none: why" (no spawner: not separated, or it cannot start here, and commands start through setpriv)."""
        spawner = self._spawner
        if spawner is None:
            return "none: commands are not separated from the agent (no spawner)"
        return "none: the spawner cannot start here" if spawner.unusable else spawner.seccomp

    def probes(self) -> dict[str, int]:
        """What was observed since the last report: the syscall policy's refusals and signals to foreign processes
        (SeccompWatch.take, none without a watch) and "network_attempt" (NetAttempts.take)."""
        out = self._watch.take() if self._watch is not None else {}
        net = self._net.take()
        if net:
            out["network_attempt"] = out.get("network_attempt", 0) + net
        return out

    def exec(self, req: dict) -> dict:
        argv = _argv(req.get("cmd"))
        timeout = _number(req, "timeout", 30.0)
        limit = int(min(_number(req, "output_limit", DEFAULT_OUTPUT_LIMIT), MAX_OUTPUT))
        kill_leftovers = req.get("kill_leftovers", False)
        if not isinstance(kill_leftovers, bool):
            raise HTTPError(400, f"field 'kill_leftovers' must be true or false, got {kill_leftovers!r}")
        env = dict(os.environ)
        env.update(_str_map(req.get("env"), "env"))
        cwd = os.path.join(self.workspace, req.get("cwd") or ".")
        if not os.path.isdir(cwd):
            return _result(1, b"", f"agent: cwd {req.get('cwd')!r} is not a directory\n".encode(), False, False,
                           time.monotonic())
        stdin = req.get("stdin")
        if stdin is not None and not isinstance(stdin, str):
            raise HTTPError(400, "field 'stdin' must be a string")
        run = ExecRun(argv, cwd, env, None if stdin is None else stdin.encode(), limit, self.identity, self.cgroup)
        before = self.counters.read()
        start = time.monotonic()
        try:
            proc = self._start(run, start + timeout)
        except OSError as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            return _result(code, b"", f"{argv[0]}: {e.strerror or e}\n".encode(), False, False, start)
        except SpawnerLost as e:  # the policy killed or stopped the spawner: its failure, a result like the above
            late = time.monotonic() >= start + timeout
            lost = None if late else -signal.SIGKILL if e.killed_in_flight else 126
            return _result(lost, b"", f"agent: {e}\n".encode(), late, False, start)
        grader = self.judge_python is not None and argv[0] == self.judge_python
        with self._lock:
            self._groups.add(proc.pid)
            if grader:
                self._targets.graders.add(proc.pid)
        try:
            result = self._finish(run, proc, start + timeout, start)
        finally:
            with self._lock:
                self._groups.discard(proc.pid)
                self._targets.graders.discard(proc.pid)
        if kill_leftovers:
            self._kill_leftovers()
        result["probes"] = self.probes()
        result["resources"] = self.counters.delta(before)
        return result

    def _start(self, run: ExecRun, deadline: float) -> Proc:
        """Start `run`'s command as the command user in `commands`: through the spawner (one clone + exec), or,
        without separation or where the spawner cannot work, with Popen (through setpriv / the cgroup shell)."""
        spawner = self._spawner
        if spawner is not None and not spawner.unusable:
            try:
                spawner.ensure(deadline)
                since = boot_ticks()
                try:
                    proc = spawner.spawn(run, deadline)
                except GoneBefore:
                    spawner.ensure(deadline)
                    proc = spawner.spawn(run, deadline)
                self._reaper.adopt(proc.pid, since)  # its exit code, should the policy kill the spawner meanwhile
                return proc
            except SpawnerUnusable as e:
                if self.relay:  # no fallback: a command started here would run in the agent's own container
                    raise HTTPError(500, f"the command spawner cannot start in the sandbox container: {e}") from None
                print(f"agent: the command spawner cannot work here ({e}); commands start through setpriv",
                      file=sys.stderr, flush=True)
                spawner.unusable = True
        popen = self.cgroup.start(lambda: self._reaper.spawn(run.start))
        reaper = self._reaper
        proc = Proc.of_popen(popen, lambda: reaper.exited(popen.pid))
        if not prefer_oom_kill(proc.pid):  # setpriv has not switched uid yet: the file is still root's, or
            with self.identity.files():  # it has (or Popen did): the file is the command user's
                prefer_oom_kill(proc.pid)
        return proc

    def _finish(self, run: ExecRun, proc: Proc, deadline: float, start: float) -> dict:
        try:
            closed = run.pump(proc, deadline, self.exit_grace_s)
        except BaseException:
            proc.kill_group()
            raise
        if not closed:
            proc.kill_group()  # pgid == pid of the main process (start_new_session); also kills SIGTERM-ignorers
            run.drain(proc, DRAIN_AFTER_KILL_S)
        code: int | None
        if proc.by_spawner:
            code = self._spawner_wait(proc, deadline, run)
        else:
            code = self._reaper.wait(proc.pid)  # the reaper collected it (never Popen.wait)
        proc.ended(code)
        return _result(None if run.timed_out else code, run.out, run.err, run.timed_out, run.truncated, start)

    def _spawner_wait(self, proc: Proc, deadline: float, run: ExecRun) -> int:
        """The command's exit code from its spawner or, when the policy killed (or stopped) the spawner meanwhile,
        from the reaper (the command was re-parented to the agent); 126 and a note when neither has it."""
        spawner = self._spawner
        assert spawner is not None, "a command the spawner started"
        try:
            code = spawner.wait(proc)
            if code is None and not self.relay:  # with --relay no command is ever the agent's child
                code = self._reaper.wait(proc.pid, STATUS_GRACE_S)
        finally:
            self._reaper.forget(proc.pid)
            proc.close_pidfd()
        if code is None:  # lost between the spawner's answer and adopt(): the policy's doing
            run.err += b"\nagent: the command's exit code was lost: its spawner was killed or stopped (by the " \
                       b"sandbox's own processes or the commands' memory limit)\n"
            return 126
        return code

    def write(self, req: dict, body: bytes | bytearray | BodyStream) -> dict:
        """PUT /file: the body written into the file as it arrives, FILE_CHUNK bytes at a time."""
        mode = req.get("mode", "420")
        if not mode.isdigit() or int(mode) > 0o7777:
            raise HTTPError(400, f"query field 'mode' must be a decimal permission number such as 420 (0o644), "
                                 f"got {mode[:40]!r}")
        mode_bits = int(mode)
        roots = (self.workspace, *self.writable)
        chunks = body.chunks() if isinstance(body, BodyStream) else iter((memoryview(body),) if body else ())
        written = 0
        with self.identity.files(), _Denied403(req.get("path")):
            target = resolve_in_workspace(self.workspace, req.get("path"), self.writable)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            target = resolve_in_workspace(self.workspace, target, self.writable)  # a parent may be a symlink now
            fd = open_regular(target, roots, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode_bits, req["path"])
            try:
                for view in chunks:
                    written += len(view)
                    while view:
                        view = view[os.write(fd, view):]
                os.fchmod(fd, mode_bits)
            finally:
                os.close(fd)
        return {"ok": True, "bytes": written}

    def read(self, req: dict) -> FileBody:
        """GET /file: the file streamed from its descriptor (FileBody), refused before anything is sent when it
        is larger than the reader's `max`."""
        limit = req.get("max")
        if limit is not None and not limit.isdigit():
            raise HTTPError(400, f"query field 'max' must be a number of bytes, got {limit[:40]!r}")
        with self.identity.files(), _Denied403(req.get("path")):
            target = resolve_in_workspace(self.workspace, req.get("path"), self.writable)
            fd = open_regular(target, (self.workspace, *self.writable), os.O_RDONLY, 0, req["path"])
        try:
            size = os.fstat(fd).st_size
            if limit is not None and size > int(limit):
                raise HTTPError(413, f"file {req['path']!r} is larger than the reader's limit of {limit} bytes "
                                     f"(max; it has {size}); read it in parts via exec", KIND_TOO_LARGE)
        except BaseException:
            os.close(fd)
            raise
        return FileBody(fd, size)

    # ------------------------------------------------------------ leftovers

    def kill_all(self, req: dict) -> dict:
        return {"killed": self._kill_leftovers(), "probes": self.probes()}

    def _kill_leftovers(self) -> int:
        """Kill every process the commands left (through their cgroup when resource-separated, else by uid or
        descent), then remove the command user's SysV IPC objects (uid-separated: the IPC namespace is the
        sandbox's own); returns how many distinct processes were killed."""
        pid = self._spawner.pid if self._spawner is not None else None
        spawner = {pid} if pid is not None else set()  # killed too, not counted
        if self.cgroup.enabled:
            killed = self.cgroup.kill(KILL_ALL_DEADLINE_S, spawner)
        else:
            killed = self._kill_by_owner(spawner)
        if self.identity.separated and self._libc is not None:
            remove_sysv_ipc(self._libc, self.identity.uid)
        return killed

    def _kill_by_owner(self, uncounted: set) -> int:
        """SIGKILL every process of the command user (separated) or every descendant of the agent (single uid),
        round after round, until none is left alive; returns how many distinct processes were killed."""
        if self.identity.separated:
            uid = self.identity.uid
            live, kill = (lambda: command_user_pids(uid)), (lambda pids: self._signal_all_as_command_user())
        else:
            live, kill = descendants, kill_pids
        with self._kill_lock:
            return kill_until_gone(live, kill, KILL_ALL_DEADLINE_S, uncounted, "of the command user")

    def _signal_all_as_command_user(self) -> None:
        """kill(-1, SIGKILL) as the command user: it reaches every process of that uid in this pid namespace at once
        (so a process forking in a loop cannot outrun it) and nothing else. From this thread alone (raw setresuid),
        so no fork is needed (a pids limit the agent shares with the commands, a pod's, may be full); from a forked
        child where that cannot be done."""
        if self._libc is not None and kill_all_as(self._libc, self.identity.uid):
            return
        uid, gid = self.identity.uid, self.identity.gid
        self._reaper.wait(self._reaper.spawn(lambda: fork_kill_all_as(uid, gid)))

    def kill_groups(self) -> None:
        if self._spawner is not None:
            self._spawner.close()
        with self._lock:
            groups = list(self._groups)
        for pgid in groups:
            kill_group(pgid)


class _Denied403:
    """Turns PermissionError (the command user may not access the path) into a 403 naming the path."""

    def __init__(self, path: object) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None and issubclass(exc_type, PermissionError):
            raise HTTPError(403, f"path {self.path!r} is not accessible to the sandbox user: {exc}") from None


def _result(code: int | None, out: bytes | bytearray, err: bytes | bytearray, timed_out: bool, truncated: bool,
            start: float) -> dict:
    return {"exit_code": code, "stdout": bytes(out).decode("utf-8", "replace"),
            "stderr": bytes(err).decode("utf-8", "replace"), "timed_out": timed_out, "truncated": truncated,
            "duration_s": round(time.monotonic() - start, 6)}


def _query(query: str) -> dict[str, str]:
    """The fields of a query string (percent-encoded UTF-8, the last of a repeated name wins); 400 when one cannot
    be decoded."""
    from urllib.parse import unquote  # only file transfers need it

    out: dict[str, str] = {}
    for part in query.split("&") if query else ():
        name, _, value = part.partition("=")
        try:
            out[unquote(name, errors="strict")] = unquote(value, errors="strict")
        except UnicodeDecodeError as e:
            raise HTTPError(400, f"query field {name[:40]!r} is not percent-encoded UTF-8: {e}", KIND_BAD_PATH) \
                from None
    return out


def _json_body(body: bytes | bytearray) -> dict:
    try:
        req = json.loads(body or b"{}")
    except ValueError as e:
        raise HTTPError(400, f"body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise HTTPError(400, "body must be a JSON object")
    return req


def _argv(cmd: object) -> list[str]:
    if isinstance(cmd, str) and cmd:
        return ["/bin/sh", "-c", cmd]
    if isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd):
        return list(cmd)
    raise HTTPError(400, "field 'cmd' must be a non-empty string (run by /bin/sh -c) or a list of strings")


def _number(req: dict, key: str, default: float) -> float:
    value = req.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise HTTPError(400, f"field {key!r} must be a positive number, got {value!r}")
    return float(value)


def _str_map(value: object, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise HTTPError(400, f"field {key!r} must be an object of string to string")
    return value
