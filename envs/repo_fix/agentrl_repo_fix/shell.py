"""The `bash` tool's persistent shell: one long-lived bash per trajectory (as SWE-ReX keeps one), so the working
directory, variables, functions and aliases carry over between calls. Built on the sandbox's plain exec / file API:

    session   `setsid bash` started by one exec with its stdio on /dev/null; it reads `run <id>` lines from the FIFO
              <dir>/in, evals <dir>/cmd.<id> in the shell itself, inside a function (stdin /dev/null, stdout+stderr
              to <dir>/log.<id>; on a timeout SIGUSR1 makes its trap `return` from that function, which stops the
              command between two of its steps, builtin loops included),
              writes `done <id>` to the FIFO <dir>/out, then waits for a `nonce <n>` line on <dir>/in and answers
              `rc <id> <n> <exit code>`; `exit` in a command reaches its EXIT trap (`exit <id> <code>`)
    a call    the host writes cmd.<id> and runs CLIENT (python, non-dumpable: the command cannot read its memory or
              fds; from its execve on where the sandbox has an execute-only interpreter, Sandbox.judge_python, else
              from its first statement) with a fresh random nonce on its stdin. CLIENT sends `run <id>`, waits for
              `done <id>` until the timeout, kills every other process of the sandbox user but the shell (background
              jobs, and on a timeout the command's foreground process), then sends the nonce and accepts only
              `rc <id> <that nonce> <code>`.
              A command cannot see that nonce before it has finished, so a forged `done` / `rc` / `exit` line (any
              process can write the FIFOs) cannot fake an exit code or end the call while a process of it still runs
              (shell builtins of the command itself can still answer for the shell: docs/envs/repo_fix.md).
              A shell that does not come back (a builtin loop past the timeout, `exit`, killed) is killed and the next
              call starts a new one; the observation says so.

The host keeps only the shell's pid and directory per Sandbox object (`ShellSessions`), never in the sandbox, where
the policy could point it at a process of its own to spare it from the per-call kill.
"""

from __future__ import annotations

import json
import secrets
import weakref
from dataclasses import dataclass

from agentrl.sandbox.client import Sandbox
from agentrl_repo_fix.config import STATE_DIR

SERVER = r"""
__agentrl_dir=$1
exec 7<>"$__agentrl_dir/in" 8<>"$__agentrl_dir/out"
echo $$ > "$__agentrl_dir/pid"
trap 'printf "exit %s %s\n" "$__agentrl_id" "$?" >"$__agentrl_dir/out"' EXIT
trap 'return 124 2>/dev/null' USR1
__agentrl_run() { set --; eval "$__agentrl_cmd"; }
shopt -s expand_aliases
cd "$2" 2>/dev/null
__agentrl_id=-
while IFS= read -r __agentrl_line <&7; do
  case $__agentrl_line in run\ *) __agentrl_id=${__agentrl_line#run };; *) continue;; esac
  __agentrl_cmd=$(cat "$__agentrl_dir/cmd.$__agentrl_id")
  __agentrl_run </dev/null >"$__agentrl_dir/log.$__agentrl_id" 2>&1 7<&- 8>&-
  __agentrl_rc=$?
  printf 'done %s\n' "$__agentrl_id" >&8
  while IFS= read -r __agentrl_line <&7; do
    case $__agentrl_line in nonce\ *) break;; esac
  done
  printf 'rc %s %s %s\n' "$__agentrl_id" "${__agentrl_line#nonce }" "$__agentrl_rc" >&8
done
"""

START = ('S=$1; mkdir -p "$S" && mkfifo "$S/in" "$S/out" || exit 1; '
         'setsid bash --noprofile --norc -c "$2" bash "$S" "$3" </dev/null >/dev/null 2>&1 & '
         'for i in $(seq 500); do [ -s "$S/pid" ] && exec cat "$S/pid"; sleep 0.01; done; exit 1')

CLIENT = r"""
import ctypes, json, os, select, signal, sys, time
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the command cannot read this process's memory or fds
S, cid, spid, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
half, by_uid = int(sys.argv[5]), sys.argv[6] == "1"
nonce = sys.stdin.readline().strip()
me, uid = os.getpid(), os.getuid()
result = {"rc": None, "timed_out": False, "lost": None, "forged": 0}

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False

def others():
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (me, spid):
            continue
        try:
            st = os.stat(f"/proc/{name}")
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if st.st_uid == uid and fields[0] != b"Z" and (by_uid or int(fields[3]) == spid):
            out.append(int(name))
    return out

def kill_others():
    end = time.monotonic() + 3
    while time.monotonic() < end:
        pids = others()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)

if not alive(spid):
    result["lost"] = "gone"
    print(json.dumps(result)); sys.exit(0)
inp = os.open(f"{S}/in", os.O_RDWR)
out = os.open(f"{S}/out", os.O_RDWR | os.O_NONBLOCK)
buf = b""

def wait(match, deadline):
    # the first line `match` accepts, or None at the deadline / when the shell is gone
    global buf
    while True:
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            got = match(line.decode("utf-8", "replace").split(" "))
            if got is not None:
                return got
        if not alive(spid):  # what it wrote before it went (its EXIT trap's line) is still in the FIFO
            try:
                more = os.read(out, 65536)
            except BlockingIOError:
                more = b""
            if not more:
                return None
            buf += more
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if select.select([out], [], [], min(left, 0.05))[0]:
            try:
                buf += os.read(out, 65536)
            except BlockingIOError:
                pass

def exited(parts):  # `exit <id> <code>` counts only when the shell really is gone
    if parts[:2] == ["exit", cid] and len(parts) == 3:
        end = time.monotonic() + 0.5
        while alive(spid) and time.monotonic() < end:
            time.sleep(0.01)
        if not alive(spid):
            return ("exit", parts[2])
        result["forged"] += 1
    return None

start = time.monotonic()
os.write(inp, f"run {cid}\n".encode())
done = wait(lambda p: ("done",) if p == ["done", cid] else exited(p), start + timeout)
if done is None and alive(spid):
    result["timed_out"] = True
    os.kill(spid, signal.SIGUSR1)  # its trap returns from the function the command runs in (builtin loops too)
kill_others()
if done is None and alive(spid):
    done = wait(lambda p: ("done",) if p == ["done", cid] else exited(p), time.monotonic() + 2)
if done == ("done",):
    os.write(inp, f"nonce {nonce}\n".encode())
    def rc(parts):
        if len(parts) == 4 and parts[:2] == ["rc", cid]:
            if parts[2] == nonce:
                return ("rc", parts[3])
            result["forged"] += 1
        return exited(parts)
    done = wait(rc, time.monotonic() + 3)
if done is not None and done[0] in ("rc", "exit"):
    result["rc"] = int(done[1]) if done[1].lstrip("-").isdigit() else None
if done is None or done[0] == "exit":
    result["lost"] = "exited" if done is not None or not alive(spid) else "stuck"
    try:
        os.kill(spid, signal.SIGKILL)
    except OSError:
        pass
    kill_others()
log = f"{S}/log.{cid}"
try:
    with open(log, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > 2 * half:
            text = f.read(half) + b"\n[... %d bytes cut ...]\n" % (size - 2 * half)
            f.seek(size - half)
            text += f.read(half)
        else:
            text = f.read(2 * half)
except OSError:
    text = b""
for path in (log, f"{S}/cmd.{cid}"):
    try:
        os.unlink(path)
    except OSError:
        pass
sys.stdout.write(json.dumps(result) + "\n")
sys.stdout.flush()
os.write(1, text)
"""

CLIENT_GRACE_S = 15.0  # the client's own waits after the command's timeout (kill, done, nonce round trip) + start-up


@dataclass
class Session:
    pid: int
    dir: str


@dataclass(frozen=True)
class ShellResult:
    output: str
    exit_code: int | None
    timed_out: bool
    note: str  # what happened to the session, for the observation ("" when nothing did)
    truncated: bool


class ShellSessions:
    """The live shell of each sandbox (keyed by the Sandbox object: one per lease, i.e. per trajectory)."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[Sandbox, Session] = weakref.WeakKeyDictionary()

    async def start(self, sandbox: Sandbox, env: dict[str, str], cwd: str) -> Session:
        """A new shell, after every process of the sandbox user (a previous shell and what it left) is killed."""
        await sandbox.kill_all()
        directory = f"{STATE_DIR}/sh-{secrets.token_hex(6)}"
        res = await sandbox.exec(["bash", "-c", START, "agentrl-start", directory, SERVER, cwd], env=env, timeout=20)
        if res.exit_code != 0 or not res.stdout.strip().isdigit():
            raise RuntimeError(f"the bash session did not start: {(res.stderr or res.stdout)[-300:]}")
        session = Session(int(res.stdout.strip()), directory)
        self._sessions[sandbox] = session
        return session

    async def run(self, sandbox: Sandbox, command: str, *, env: dict[str, str], cwd: str, timeout_s: float,
                  half: int) -> ShellResult:
        """Run `command` in the sandbox's shell (started on first use; restarted, with a note, when it was gone)."""
        note = ""
        session = self._sessions.get(sandbox)
        if session is None:
            session = await self.start(sandbox, env, cwd)
        result, text = await self._call(sandbox, session, command, timeout_s, half)
        if result["lost"] == "gone":  # killed between calls: the command did not run; run it in a new shell
            session = await self.start(sandbox, env, cwd)
            note = ("[the previous shell session was gone; this command ran in a new one (working directory, "
                    "variables, functions and aliases were reset)]")
            result, text = await self._call(sandbox, session, command, timeout_s, half)
        if result["lost"] in ("exited", "stuck"):
            self._sessions.pop(sandbox, None)
            why = ("the shell exited" if result["lost"] == "exited"
                   else "the shell did not stop after the timeout and was killed")
            note = (f"[{why}; the next command starts a new shell session (working directory, variables, functions "
                    "and aliases are reset)]")
        return ShellResult(text, result["rc"], bool(result["timed_out"]), note, " bytes cut ...]" in text)

    async def _call(self, sandbox: Sandbox, session: Session, command: str, timeout_s: float,
                    half: int) -> tuple[dict, str]:
        cid = secrets.token_hex(6)
        nonce = secrets.token_hex(16)
        await sandbox.write_file(f"{session.dir}/cmd.{cid}", command)
        argv = [sandbox.grader_python, "-I", "-S", "-c", CLIENT, session.dir, cid, str(session.pid),
                f"{timeout_s:g}", str(half), "1" if sandbox.uid_separated else "0"]
        res = await sandbox.exec(argv, stdin=nonce + "\n", timeout=timeout_s + CLIENT_GRACE_S)
        header, _, text = res.stdout.partition("\n")
        try:
            result = json.loads(header)
        except ValueError:
            raise RuntimeError(f"the bash session client failed (exit {res.exit_code}): "
                               f"{(res.stderr or res.stdout)[-300:]!r}") from None
        return result, text
