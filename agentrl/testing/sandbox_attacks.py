"""Attacks a hostile policy can run from inside a sandbox against its control plane, as reusable checks.

Each `attack_*` coroutine runs one attack through `Sandbox.exec` exactly as a tool call would, and asserts that it
failed and that the sandbox still serves (the agent lives, the next exec works). They need a uid-separated sandbox
(`sb.uid_separated`); the local (as root) and docker test tiers run them, the Kubernetes pod spec is checked by
tests/k8s/test_pod_policy.py. Imports nothing but the sandbox client types.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.sandbox.client import Sandbox, SandboxPathError
from agentrl.testing.policy_attacks import PROBE_ATTACKS, attack_hide_an_oom_kill, attack_probe_the_kernel, still_serves

# defines agent_of() -> (pid, --unix socket path or "") of the agent, or None: found through /proc/*/cmdline, which
# every process may read (also the chaos tier's signal_the_agent attack, `scripted_attacks`)
AGENT_LOOKUP = r"""
import os
def agent_of():
    for pid in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        shipped = any(a.rsplit(b"/", 1)[-1].startswith(b"agent") and a.endswith(b".pyz") for a in argv)  # agent.pyz
        if shipped and b"--workspace" in argv:
            return int(pid), argv[argv.index(b"--unix") + 1].decode() if b"--unix" in argv else ""
    return None
"""
# prints the pid of the agent and its --unix socket
FIND_AGENT = AGENT_LOOKUP + "found = agent_of()\nif found:\n    print(*found)\n"
# kill(-1, SIGKILL): every process the caller may signal
KILL_EVERY_PROCESS = "import os\nos.kill(-1, 9)"

PTRACE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
for req in (PTRACE_ATTACH, PTRACE_SEIZE):
    rc = libc.ptrace(req, int(sys.argv[1]), 0, 0)
    print(req, rc, os.strerror(ctypes.get_errno()))
"""


async def agent_of(sb: Sandbox) -> tuple[int, str]:
    """(pid, unix socket path or "") of the sandbox's agent, as a command sees it."""
    r = await sb.exec(["python3", "-c", FIND_AGENT])
    assert r.exit_code == 0 and r.stdout.strip(), f"agent not found from inside: {r}"
    pid, _, sock = r.stdout.strip().partition(" ")
    return int(pid), sock


# prints the pids of the command spawner(s) of the sandbox (processes of the caller's uid running the agent's
# fork server, whose source starts with a comment naming it), found through /proc/*/cmdline like FIND_AGENT
FIND_SPAWNER = r"""
import os
marker = b"agentrl command " + b"spawner"  # not literally in this script's own command line
for pid in os.listdir("/proc"):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read()
        uid = [line for line in open(f"/proc/{pid}/status") if line.startswith("Uid:")][0].split()[1]
    except (OSError, IndexError):
        continue
    if marker in argv and int(uid) == os.getuid() and int(pid) != os.getpid():
        print(pid)
"""

# ptrace-attach and open /proc/PID/mem of argv[1] and of a forked child of the same uid (the control: it must
# work there, so a refusal is the target's non-dumpable flag, not a blanket ban); one line each:
# ptrace rc|its error|what opening mem gave|owner uid of /proc/PID/mem (root's when non-dumpable)
TRACE_SAME_UID = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)

def probe(pid):
    rc = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
    err = os.strerror(ctypes.get_errno())
    try:
        open(f"/proc/{pid}/mem", "rb").close()
        mem = "opened"
    except OSError as e:
        mem = e.strerror
    return f"{rc}|{err}|{mem}|{os.stat(f'/proc/{pid}/mem').st_uid}"

child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
print(probe(int(sys.argv[1])))
print(probe(child))
os.kill(child, 9)
"""


async def spawner_of(sb: Sandbox) -> int:
    """The pid of the sandbox's command spawner, as a command sees it (exactly one, of the command user)."""
    r = await sb.exec(["python3", "-c", FIND_SPAWNER])
    pids = r.stdout.split()
    assert r.exit_code == 0 and len(pids) == 1, f"not exactly one command spawner of the command user: {r}"
    return int(pids[0])


async def attack_kill_everything(sb: Sandbox) -> None:
    """kill(-1, SIGKILL) from the shell and from Python kills only the policy's own processes."""
    await sb.exec("sleep 60 > /dev/null 2>&1 &")
    r = await sb.exec("kill -9 -1; echo shell-survived-its-own-kill")
    if not _lost_with_its_spawner(sb, r):  # kill -1 spares the caller
        assert r.exit_code == 0 and r.stdout == "shell-survived-its-own-kill\n", r
    r = await sb.exec(["python3", "-c", KILL_EVERY_PROCESS])
    assert r.exit_code == -9 or r.exit_code is None or r.exit_code == 0 or _lost_with_its_spawner(sb, r), r
    await still_serves(sb)
    assert "sleep" not in (await sb.exec("cat /proc/[0-9]*/comm")).stdout.split(), "the policy's own sleep survived"


async def attack_signal_the_agent(sb: Sandbox) -> None:
    pid, _ = await agent_of(sb)
    for sig in ("KILL", "STOP", "TERM"):
        r = await sb.exec(f"kill -{sig} {pid}")
        assert r.exit_code != 0 and "not permitted" in r.stderr.lower(), (sig, r)
    kill = f"import os\ntry:\n os.kill({pid}, 9)\nexcept PermissionError:\n print('EPERM')"
    r = await sb.exec(["python3", "-c", kill])
    assert r.stdout.strip() == "EPERM", r
    await still_serves(sb)


async def attack_read_the_agent(sb: Sandbox, token_file: str | None = None) -> None:
    """Its environment, file descriptors, memory, and (Kubernetes) its bearer token stay unreadable."""
    pid, _ = await agent_of(sb)
    for path in (f"/proc/{pid}/environ", f"/proc/{pid}/mem", f"/proc/{pid}/fd/0", f"/proc/{pid}/maps"):
        r = await sb.exec(["cat", path])
        assert r.exit_code != 0 and "denied" in r.stderr.lower(), (path, r)
    r = await sb.exec(["ls", f"/proc/{pid}/fd"])
    assert r.exit_code != 0 and "denied" in r.stderr.lower(), r
    if token_file:
        r = await sb.exec(["cat", token_file])
        assert r.exit_code != 0 and not r.stdout, r
    await still_serves(sb)


async def attack_ptrace_the_agent(sb: Sandbox) -> None:
    pid, _ = await agent_of(sb)
    r = await sb.exec(["python3", "-c", PTRACE, str(pid)])
    assert r.exit_code == 0, r
    for line in r.stdout.splitlines():
        _, rc, err = line.split(" ", 2)
        assert rc == "-1" and "not permitted" in err.lower(), r.stdout
    await still_serves(sb)


async def attack_trace_the_spawner(sb: Sandbox) -> None:
    """The command spawner runs as the command user, but non-dumpable: a command can neither ptrace it nor read its
    memory (which holds nothing but could forge spawns), while it can read its own same-uid child's memory."""
    pid = await spawner_of(sb)
    r = await sb.exec(["python3", "-c", TRACE_SAME_UID, str(pid)])
    assert r.exit_code == 0, r
    spawner, control = (line.split("|") for line in r.stdout.splitlines())
    # the control: its own same-uid child's memory opens (ptrace itself is refused to every command by the syscall
    # policy, EPERM, and counted)
    assert control[0] == "-1" and control[2] == "opened" and control[3] == str(sb.command_uid), r.stdout
    assert spawner[0] == "-1" and "not permitted" in spawner[1].lower(), r.stdout
    assert r.probes.get("ptrace") == 2, r
    assert spawner[2] == "Permission denied" and spawner[3] == "0", r.stdout
    await still_serves(sb)


def _lost_with_its_spawner(sb: Sandbox, r: Any) -> bool:
    """Commands in another container than the agent (`commands_apart`: kubernetes, docker without host cgroups):
    their orphans go to that pid namespace's init, so a command whose spawner the policy killed or stopped loses
    its exit code (126 and a note: the policy's doing), never the agent or its output."""
    if not sb.agent_info.get("commands_apart"):
        return False
    return (r.exit_code == 126 and "exit code was lost" in r.stderr) or (
        r.exit_code == -9 and "killed while it started the command" in r.stderr)  # it ended before the agent looked


async def attack_kill_the_spawner(sb: Sandbox) -> None:
    """Killing the spawner costs the policy nothing but that process: the next exec gets a fresh one."""
    pid = await spawner_of(sb)
    # a command that kills the spawner at once may beat the spawner's answer: that exec then fails (126, the
    # policy's); here it waits so that its own exec gets its answer first
    r = await sb.exec(f"sleep 1; kill -9 {pid}")
    assert r.exit_code == 0 or _lost_with_its_spawner(sb, r), r
    await still_serves(sb)
    assert await spawner_of(sb) != pid


async def attack_stop_the_spawner(sb: Sandbox) -> None:
    """A stopped spawner costs the exec that needs it and nothing else: one whose command it started gets its exit
    code from the agent once the spawner is replaced (STATUS_GRACE_S later); one it should start times out."""
    pid = await spawner_of(sb)
    r = await sb.exec(f"sleep 0.5; kill -STOP {pid}; echo stopped")
    assert (r.exit_code == 0 or _lost_with_its_spawner(sb, r)) and r.stdout == "stopped\n", r
    await still_serves(sb)
    pid = await spawner_of(sb)
    r = await sb.exec(f"(sleep 0.3; kill -STOP {pid}) >/dev/null 2>&1 &")
    assert r.exit_code == 0, r
    await asyncio.sleep(2.0)
    r = await sb.exec(["true"], timeout=1)
    assert r.timed_out and r.exit_code is None and "spawner stopped answering" in r.stderr, r
    await still_serves(sb)
    assert await spawner_of(sb) != pid


async def attack_socket_dir(sb: Sandbox) -> None:
    """The agent's socket directory can be neither listed, written, nor the socket replaced."""
    _, sock = await agent_of(sb)
    if not sock:
        return  # tcp agent (Kubernetes): no socket directory
    run_dir = sock.rpartition("/")[0]
    if (await sb.exec(f"test -e {sock}")).exit_code != 0 and sb.agent_info.get("commands_apart"):
        await still_serves(sb)
        return  # the commands' container does not have the agent's socket at all
    for cmd in (f"ls {run_dir}", f"echo x > {run_dir}/planted", f"rm -f {sock}", f"mv {sock} {sock}.old",
                f"python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('{sock}')\""):
        r = await sb.exec(cmd)
        assert r.exit_code != 0, (cmd, r)
    await still_serves(sb)


DAEMON = ("setsid sh -c 'while true; do echo x >> /workspace/daemon.log; sleep 0.02; done' "
          "> /dev/null 2>&1 < /dev/null &")
REFORKER = ("setsid python3 -c \"import os, time\nwhile True:\n    if os.fork():\n        os._exit(0)\n"
            "    time.sleep(0.01)\" > /dev/null 2>&1 < /dev/null &")


async def _log_size(sb: Sandbox) -> int:
    r = await sb.exec("stat -c %s daemon.log 2>/dev/null || echo 0")
    return int(r.stdout.strip() or 0)


async def attack_daemon_outlives_the_call(sb: Sandbox) -> None:
    """A setsid daemon (and a process that re-forks itself) survive the call, then `kill_all()` ends them: the
    workspace stops changing."""
    await sb.exec(DAEMON + " " + REFORKER + " sleep 0.2")
    await asyncio.sleep(0.2)
    assert await _log_size(sb) > 0, "the daemon did not start"
    killed = await sb.kill_all()
    assert killed >= 2, killed
    size = await _log_size(sb)
    await asyncio.sleep(0.3)
    assert await _log_size(sb) == size, "a daemon still writes to the workspace after kill_all()"
    assert await sb.kill_all() == 0
    await still_serves(sb)


async def attack_daemon_with_kill_leftovers(sb: Sandbox) -> None:
    r = await sb.exec(DAEMON + " echo started", kill_leftovers=True)
    assert r.stdout == "started\n", r
    size = await _log_size(sb)
    await asyncio.sleep(0.3)
    assert await _log_size(sb) == size, "a daemon outlived an exec with kill_leftovers=True"
    assert await sb.kill_all() == 0
    await still_serves(sb)


SYMLINK_CHAIN = r"""
import os
os.makedirs('chain', exist_ok=True)
os.symlink('../chain-target.txt', 'chain/0')
for i in range(1, 1200):
    os.symlink(str(i - 1), f'chain/{i}')
os.symlink('chain/1199', 'chained.py')
os.symlink('loop-b', 'loop-a')
os.symlink('loop-a', 'loop-b')
open('chain-target.txt', 'w').write('x')
"""


async def attack_unresolvable_paths(sb: Sandbox) -> None:
    """A 1,200-link symlink chain and a loop where the host reads or writes: a path error (the policy's), never an
    agent error (5xx: infra, unscored) and never a hang."""
    r = await sb.exec(["python3", "-c", SYMLINK_CHAIN])
    assert r.exit_code == 0, r
    for path in ("chained.py", "loop-a", "loop-a/deeper.py"):
        for request in (sb.read_file(path), sb.write_file(path, "y")):
            try:
                async with asyncio.timeout(10):
                    await request
            except SandboxPathError as exc:
                assert "symbolic links" in str(exc), exc
            else:
                raise AssertionError(f"{path}: the agent followed an unresolvable path")
    await still_serves(sb)


# ---------------------------------------------------------------- graders at their start
# A command-user process started before a grader: it polls /proc for a process whose command line carries the mark
# (argv[1] + "-" + argv[2], so that its own does not), opens its /proc/<pid>/mem the moment it appears and prints
# what that gave and the owner of that file (root's when the target is non-dumpable), or "never saw it".
WATCH_START = r"""
import os, sys, time
mark = (sys.argv[1] + "-" + sys.argv[2]).encode()
end = time.time() + 20
while time.time() < end:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if mark not in f.read():
                    continue
        except OSError:
            continue
        try:
            os.close(os.open(f"/proc/{p}/mem", os.O_RDONLY))
            got = "opened"
        except OSError as e:
            got = e.strerror
        print(got, os.stat(f"/proc/{p}/mem").st_uid, flush=True)
        sys.exit(0)
print("never saw it", flush=True)
"""
START_MARK = "agentrl-grader-start-probe"
# a grader's stand-in: it sleeps first and never makes itself non-dumpable, so only how it was started counts
SLEEP_FIRST = f"import time; time.sleep(1.5)  # {START_MARK}"


async def open_at_start(sb: Sandbox, argv: list[str]) -> str:
    """Start the WATCH_START daemon, then `argv` (whose command line must carry START_MARK); what the daemon got."""
    out_file = "/tmp/agentrl-watch.out"
    await sb.exec(["rm", "-f", out_file])
    await sb.exec(["sh", "-c", 'setsid python3 -c "$0" "$1" "$2" >"$3" 2>&1 </dev/null & sleep 0.3', WATCH_START,
                   *START_MARK.split("-", 1), out_file])
    r = await sb.exec(argv, timeout=20)
    assert r.exit_code == 0, r
    for _ in range(100):
        out = (await sb.exec(["cat", out_file])).stdout.strip()
        if out:
            return out
        await asyncio.sleep(0.1)
    raise AssertionError("the watching daemon wrote nothing")


async def attack_open_a_grader_at_its_start(sb: Sandbox) -> None:
    """A daemon of the policy waiting for a grader cannot open its memory even before the grader's first statement
    when it runs on `sb.judge_python`; on plain python3 (the control) the same daemon opens it."""
    assert sb.judge_python, f"no execute-only interpreter for graders in this sandbox: {sb.agent_info}"
    got = await open_at_start(sb, [sb.judge_python, "-I", "-c", SLEEP_FIRST])
    assert got == "Permission denied 0", got  # refused, and /proc/<pid>/mem is root's: non-dumpable
    control = await open_at_start(sb, ["python3", "-I", "-c", SLEEP_FIRST])
    assert control == f"opened {sb.command_uid}", control
    await sb.kill_all()
    await still_serves(sb)


ALL = (attack_kill_everything, attack_signal_the_agent, attack_read_the_agent, attack_ptrace_the_agent,
       attack_socket_dir, attack_daemon_outlives_the_call, attack_daemon_with_kill_leftovers,
       attack_unresolvable_paths, attack_trace_the_spawner, attack_kill_the_spawner, attack_stop_the_spawner,
       attack_probe_the_kernel, *PROBE_ATTACKS)


# ---------------------------------------------------------------- the control plane's own resources
# These need a resource-separated sandbox (`sb.resources_separated`: the commands' memory / pids / CPU limits are
# not the agent's). Each one exhausts one budget from a daemon that outlives its call, then checks that the agent
# still answers (on a fresh connection too: that needs a new thread), that kill_all() ends it, and that the next
# command has the whole budget back.

SHM = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
chunk, total = int(sys.argv[1]), int(sys.argv[2])
if "lower" in sys.argv[3:]:  # after the agent raised it (it does so once the command started)
    time.sleep(0.3)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
hold = "hold" in sys.argv[3:]  # keep every segment attached (where detaching removes it: kernel.shm_rmid_forced)
for _ in range(total // chunk):  # attach, fill, detach: the memory stays charged, no process holds it
    shmid = libc.shmget(IPC_PRIVATE, chunk, IPC_CREAT | 0o600)
    if shmid < 0:
        break
    addr = libc.shmat(shmid, None, 0)
    ctypes.memset(addr, 1, chunk)
    if not hold:
        libc.shmdt(ctypes.c_void_p(addr))
    print("segment", shmid, flush=True)
"""
PIDS_HOG = (r"""setsid python3 -c "
import os, time
n = 0
while True:  # takes every pid that frees up, for ever
    try:
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        n += 1
    except OSError:
        if not os.path.exists('/workspace/hog.txt'):
            open('/workspace/hog.txt', 'w').write(str(n))
        time.sleep(0.005)" > /dev/null 2>&1 < /dev/null & """)
SPIN = "setsid python3 -c 'while True: pass' > /dev/null 2>&1 < /dev/null & "


async def _fresh_health(sb: Sandbox) -> bool:
    """/health over a new connection (the agent starts a thread for it)."""
    fresh = Sandbox(sb.handle, sb.spec)
    try:
        return await fresh.health()
    finally:
        await fresh.close()


async def _recovers(sb: Sandbox) -> None:
    """kill_all() ends what the attack left, the SysV objects included, and the next command runs."""
    await sb.kill_all()
    r = await sb.exec("cat /proc/sysvipc/shm /proc/sysvipc/sem /proc/sysvipc/msg | grep -cv '^ *key' || true")
    assert r.stdout.strip() == "0", f"SysV IPC objects survived kill_all(): {r}"
    await still_serves(sb)


async def shm_rmid_forced(sb: Sandbox) -> bool:
    """Whether the sandbox's IPC namespace removes a SysV segment when its last process detaches (the docker and
    kubernetes backends set kernel.shm_rmid_forced=1: memory no process holds cannot build up there)."""
    r = await sb.exec("cat /proc/sys/kernel/shm_rmid_forced")
    assert r.exit_code == 0, r
    return r.stdout.strip() == "1"


async def attack_sysv_shm_outlives_every_process(sb: Sandbox) -> None:
    """SysV shared memory holding most of the memory limit after its creator exited: the kernel removed it at the
    detach (kernel.shm_rmid_forced) or kill_all() removes it, so the next command (the grader) gets the memory back."""
    mem = sb.spec.memory_bytes
    forced = await shm_rmid_forced(sb)
    await sb.write_file("shm.py", SHM)
    r = await sb.exec(["python3", "shm.py", str(8 << 20), str(mem * 3 // 4)], timeout=60)
    assert r.stdout.count("segment") >= 3, r
    r = await sb.exec("grep -cv '^ *key' /proc/sysvipc/shm")
    if forced:
        assert r.stdout.strip() == "0", f"shm_rmid_forced is set, yet segments outlived their creator: {r}"
    else:
        assert int(r.stdout) >= 3, f"the segments should outlive their creator: {r}"
    await _recovers(sb)
    r = await sb.exec(["python3", "-c", f"b = bytearray({mem * 3 // 4}); print('allocated')"], timeout=60)
    assert r.stdout == "allocated\n", f"the memory of the removed segments is still charged: {r}"


async def attack_memory_fill_after_lowering_oom_adj(sb: Sandbox) -> None:
    """A daemon lowers its oom_score_adj back to the agent's and fills the memory limit with shared memory (held by
    no process; where the kernel removes detached segments, held by the daemon): the OOM killer may only pick among
    the commands, never the agent, the relay or bubblewrap."""
    mem = sb.spec.memory_bytes
    mode = ["lower", "hold"] if await shm_rmid_forced(sb) else ["lower"]
    await sb.write_file("shm.py", SHM)
    r = await sb.exec(["python3", "shm.py", str(1 << 20), str(mem * 2), *mode], timeout=60)
    assert r.exit_code != 0 or r.stdout.count("segment") < (mem * 2) // (1 << 20), f"the limit did not hold: {r}"
    assert await sb.health(), "the agent died: the commands' OOM killer took it"
    assert await _fresh_health(sb), "the agent cannot serve a new connection"
    await _recovers(sb)


async def attack_pids_filled_by_a_daemon(sb: Sandbox) -> None:
    """A daemon holds every pid of the limit: the agent still starts the thread for a new connection, kill_all()
    needs no fork of its own, and afterwards commands can fork again."""
    await sb.exec(PIDS_HOG + " sleep 0.1")
    forks = ""
    for _ in range(100):  # read through the file API: a command may not be able to fork now
        try:
            forks = await sb.read_file("hog.txt")
            break
        except FileNotFoundError:
            await asyncio.sleep(0.1)
    assert int(forks or 0) >= sb.spec.pids - 16, f"the daemon did not fill the pids limit: {forks!r}"
    await asyncio.sleep(0.3)  # the daemon also takes the pids the last commands freed
    assert await sb.health() and await _fresh_health(sb), "the agent cannot start a thread for a new connection"
    assert await sb.kill_all() >= 10
    await still_serves(sb)
    r = await sb.exec("for i in 1 2 3 4 5 6 7 8; do sleep 0.2 & done; wait; echo forked")
    assert r.stdout == "forked\n", r


async def attack_busy_loops_in_the_cpu_quota(sb: Sandbox, *, loops: int = 6, limit_s: float = 5.0) -> None:
    """Busy loops use the whole CPU quota of the commands: file reads and health checks of the control plane keep
    their own CPU time (with a shared quota the agent gets a slice of what is left, and a read times out)."""
    payload = bytes(range(256)) * (16 * 4096)  # 16 MiB: ~0.1 s of the agent's CPU to read and encode
    await sb.write_file("big.bin", payload)
    await sb.exec(SPIN * loops + " sleep 0.5")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with asyncio.timeout(60):
        data = await sb.read_bytes("big.bin")
        assert await sb.health()
    took = loop.time() - t0
    assert data == payload
    assert took < limit_s, f"the agent was throttled with the commands: a read took {took:.1f}s"
    assert await sb.kill_all() >= loops
    await still_serves(sb)


RESOURCE_ATTACKS = (attack_sysv_shm_outlives_every_process, attack_memory_fill_after_lowering_oom_adj,
                    attack_pids_filled_by_a_daemon, attack_hide_an_oom_kill)  # attack_busy_loops_in_the_cpu_quota
# needs a small cpus spec
