"""Attacks on what the syscall policy and the agent's counters observe (agentrl/sandbox/agent/: seccomp.py and
ResourceCounters, SignalTargets, NetAttempts), as reusable checks that every tier runs through
`sandbox_attacks.ALL` / `RESOURCE_ATTACKS`: probes of kernel interfaces a task never needs are refused and counted,
an OOM kill the exit code hides is counted, signals to processes the command did not start and attempts to reach a
network the sandbox does not have are counted (PROBE_ATTACKS), and what honest commands do with signals and
localhost sockets counts nothing (`attack_none_honest_signals_and_sockets`, the false-positive check). Imports
nothing but the sandbox client types.
"""

from __future__ import annotations

import asyncio

from agentrl.sandbox.client import Sandbox


async def still_serves(sb: Sandbox) -> None:
    assert await sb.health(), "the agent died"
    r = await sb.exec("echo alive")
    assert r.exit_code == 0 and r.stdout == "alive\n", r


# the kernel interfaces a task never needs, each called once (numbers per architecture, resolved inside the sandbox:
# a Kubernetes node may not be the test runner's architecture); prints NAME RC ERRNO per call
PROBE_THE_KERNEL = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"add_key": 248, "keyctl": 250, "ptrace": 101, "unshare": 272, "io_uring_setup": 425, "bpf": 321,
                 "perf_event_open": 298, "mount": 165, "process_vm_readv": 310},
      "aarch64": {"add_key": 217, "keyctl": 219, "ptrace": 117, "unshare": 97, "io_uring_setup": 425, "bpf": 280,
                  "perf_event_open": 241, "mount": 40, "process_vm_readv": 270}}[os.uname().machine]
ARGS = {"add_key": (b"user", b"agentrl-probe", b"x", 1, -4), "keyctl": (0, -4, 0), "ptrace": (16, 1, 0, 0),
        "unshare": (0x10000000,), "io_uring_setup": (1, 0), "bpf": (0, 0, 0), "perf_event_open": (0, 0, -1, -1, 0),
        "mount": (b"none", b"/tmp", b"tmpfs", 0, 0), "process_vm_readv": (1, 0, 0, 0, 0, 0)}
for name, nr in NR.items():
    rc = libc.syscall(nr, *ARGS[name])
    print(name, rc, ctypes.get_errno() if rc < 0 else 0)
filters = [line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp_filters:")]
print("keyctl", 1, 0)  # a forged line: counts come from the kernel's notifications, not from output
print("filters", filters[0] if filters else "1", 0)
"""


async def attack_probe_the_kernel(sb: Sandbox) -> None:
    """Keyrings (a channel between episodes where uids are shared), ptrace, namespaces, io_uring, bpf, perf and
    mounts: refused with EPERM by the one syscall policy every backend installs, and each call counted by the agent
    (`probes`), whatever the command prints."""
    r = await sb.exec(["python3", "-c", PROBE_THE_KERNEL])
    assert r.exit_code == 0, r
    *calls, _, filters = [line.split() for line in r.stdout.splitlines()]
    assert calls and all(rc == "-1" and err == "1" for _, rc, err in calls), r.stdout
    # agentrl's policy alone on every backend (a runtime's profile underneath would refuse some calls first, its
    # ERRNO outranking the notification, uncounted): every refusal is counted, once
    assert filters[1] == "1", f"another seccomp filter under agentrl's: {r.stdout}"
    assert r.probes == {name: 1 for name, _, _ in calls}, r
    await sb.health()
    assert sb.agent_info.get("seccomp") == "notify", sb.agent_info
    await still_serves(sb)


OOM_UNDER_EXIT_0 = r"""
import subprocess, sys
r = subprocess.run([sys.executable, "-c", "b = []\nwhile True: b.append(bytearray(16 << 20))"])
print("child", r.returncode)
"""


async def attack_hide_an_oom_kill(sb: Sandbox) -> None:
    """A child killed by the commands' OOM killer under a main process that exits 0: the exit code says nothing,
    the agent's counters of the commands' cgroup (`resources`, read through the spawner's descriptors where the
    commands run in another container) say oom_kills."""
    r = await sb.exec(["python3", "-c", OOM_UNDER_EXIT_0], timeout=60)
    assert r.exit_code == 0 and r.stdout == "child -9\n", r
    assert r.resources.get("oom_kills", 0) >= 1, r
    await still_serves(sb)


# signals (and signal checks, sig 0) to processes the command did not start, every call that can do it once: the
# agent (another uid: refused by the kernel), the spawner (the command user's, non-dumpable: SIGCONT is delivered)
# and the agent's process group; prints what each call gave and a forged "no probes" line
SIGNAL_FOREIGN = r"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
TGKILL, RT_TGSIGQUEUEINFO = {"x86_64": (234, 297), "aarch64": (131, 240)}[os.uname().machine]
agent = spawner = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if any(a.rsplit(b"/", 1)[-1].startswith(b"agent") and a.endswith(b".pyz") for a in argv) and b"--workspace" in argv:
        agent = int(pid)
    if b"agentrl command " + b"spawner" in b" ".join(argv) and os.stat(f"/proc/{pid}/mem").st_uid != os.getuid():
        spawner = int(pid)  # the command user's, but its /proc/PID/mem is root's: non-dumpable
def attempt(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, e.strerror)
attempt("kill", lambda: os.kill(agent, 0))
if os.getpgid(agent):  # 0 where its leader is outside this pid namespace; 1 (bubblewrap): that is kill(-1)
    attempt("killpg", lambda: os.killpg(os.getpgid(agent), 0))
attempt("tgkill", lambda: libc.syscall(TGKILL, agent, agent, 0) == 0 or os.strerror(ctypes.get_errno()))
attempt("spawner", lambda: os.kill(spawner, signal.SIGCONT))
fd = os.pidfd_open(agent)  # no permission check, and no signal: a handle on a foreign process
attempt("pidfd_send_signal", lambda: signal.pidfd_send_signal(fd, 0))
proc = os.open(f"/proc/{agent}", os.O_RDONLY | os.O_DIRECTORY)  # a /proc directory is a pidfd too
attempt("procfd_send_signal", lambda: signal.pidfd_send_signal(proc, 0))
print("probes {}")  # forged: counts come from the kernel's notifications, not from output
"""


async def attack_signal_foreign_processes(sb: Sandbox) -> None:
    """Signals to the agent and the spawner through every call that can send one (kill, kill of a group, tgkill,
    pidfd_open + pidfd_send_signal, a /proc directory as a pidfd): the kernel refuses those to the agent and lets
    the command user's SIGCONT reach its spawner, and the agent counts each one ("signal_foreign"),
    whatever the command prints. The count grants nothing: the refused stay refused."""
    r = await sb.exec(["python3", "-c", SIGNAL_FOREIGN])
    assert r.exit_code == 0, r
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert all(out[k] == "Operation not permitted" for k in ("kill", "pidfd_send_signal", "procfd_send_signal")), r
    assert out["spawner"] == "ok", r
    assert r.probes == {"signal_foreign": 6 if "killpg" in out else 5}, r
    await still_serves(sb)


# the kernel signals a descriptor's owner on its I/O (SIGIO, or F_SETSIG's signal) under its own permission check:
# naming a foreign process as the owner is a signal without kill(); owners set here, no I/O triggered
SIGIO_OWNER = r"""
import fcntl, os, socket, struct
agent = spawner = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    if any(a.rsplit(b"/", 1)[-1].startswith(b"agent") and a.endswith(b".pyz") for a in argv) and b"--workspace" in argv:
        agent = int(pid)
    if b"agentrl command " + b"spawner" in b" ".join(argv) and os.stat(f"/proc/{pid}/mem").st_uid != os.getuid():
        spawner = int(pid)
r, w = os.pipe()
fcntl.fcntl(r, fcntl.F_SETOWN, agent)
fcntl.fcntl(r, fcntl.F_SETOWN, spawner)
fcntl.fcntl(r, 15, struct.pack("ii", 1, agent))  # F_SETOWN_EX, F_OWNER_PID
s = socket.socket()
fcntl.ioctl(s, 0x8901, struct.pack("i", agent))  # FIOSETOWN
fcntl.fcntl(r, fcntl.F_SETOWN, os.getpid())  # its own: not counted
print("owners set", fcntl.fcntl(r, fcntl.F_GETOWN) == os.getpid())
"""


async def attack_sigio_to_foreign_processes(sb: Sandbox) -> None:
    """A foreign process named as the owner of a descriptor (fcntl F_SETOWN, F_SETOWN_EX, ioctl FIOSETOWN), which the
    kernel would signal on its I/O: counted ("sigio_foreign"), its own pid not."""
    r = await sb.exec(["python3", "-c", SIGIO_OWNER])
    assert r.exit_code == 0 and r.stdout == "owners set True\n", r
    assert r.probes == {"sigio_foreign": 4}, r
    await still_serves(sb)


# a daemon that signals the agent after its command returned: counted at the next report (here /kill_all)
SIGNAL_LATER = r"""
import os, subprocess, sys
agent = next(int(p) for p in filter(str.isdigit, os.listdir("/proc"))
             if b"--workspace" in open(f"/proc/{p}/cmdline", "rb").read().split(b"\0"))
later = f"import os, time\ntime.sleep(0.5)\ntry:\n os.kill({agent}, 0)\nexcept OSError:\n pass\ntime.sleep(60)"
subprocess.Popen([sys.executable, "-c", later], start_new_session=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
"""


async def attack_signal_after_the_command(sb: Sandbox) -> None:
    """A background process that signals the agent after its command returned is counted all the same: the
    watch is the episode's, not the command's; /kill_all reports what came after the last command."""
    sb.take_observed()
    r = await sb.exec(["python3", "-c", SIGNAL_LATER])
    assert r.exit_code == 0 and r.probes == {}, r
    await _counted_after_the_command(sb, {"signal_foreign": 1})


async def _counted_after_the_command(sb: Sandbox, expected: dict[str, int]) -> None:
    """What a background process did once its command had returned (within 1.5 s) is reported by /kill_all, once."""
    sb.take_observed()
    await asyncio.sleep(1.5)
    await sb.kill_all()
    seen = [o.probes for o in sb.take_observed() if o.probes]
    assert seen == [expected], seen
    await still_serves(sb)


# attempts to reach a network the sandbox does not have: TCP and UDP to documentation addresses, IPv6 too (where
# the namespace has IPv6), and a background process that tries after its command returned
REACH_OUT = r"""
import socket, subprocess, sys
print("interfaces", len([line for line in open("/proc/net/dev").readlines()[2:] if line.split(":")[0].strip() != "lo"]))
def attempt(name, family, kind, addr):
    s = socket.socket(family, kind)
    s.settimeout(1)
    try:
        s.connect(addr) if kind == socket.SOCK_STREAM else s.sendto(b"x", addr)
        print(name, "sent")
    except OSError as e:
        print(name, e.errno)
attempt("tcp", socket.AF_INET, socket.SOCK_STREAM, ("192.0.2.1", 80))
attempt("udp", socket.AF_INET, socket.SOCK_DGRAM, ("198.51.100.1", 53))
try:
    attempt("tcp6", socket.AF_INET6, socket.SOCK_STREAM, ("2001:db8::1", 80, 0, 0))
except OSError as e:  # no IPv6 here
    print("tcp6", "none")
subprocess.Popen([sys.executable, "-c", "import socket, time\ntime.sleep(0.5)\ntry:\n socket.create_connection("
                  "('203.0.113.1', 443), 1)\nexcept OSError:\n pass\ntime.sleep(60)"], start_new_session=True)
print("probes {}")  # forged
"""


async def attack_reach_the_network(sb: Sandbox) -> None:
    """In a sandbox without network every attempt to reach one fails its route lookup, and the kernel's counters of
    the sandbox's network namespace count it ("network_attempt"), whichever call or process (background ones at the
    next report, here /kill_all); nothing is sent."""
    sb.take_observed()
    r = await sb.exec(["python3", "-c", REACH_OUT], timeout=30)
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    if out.get("interfaces") != "0":  # a network namespace with an interface (a Kubernetes pod's, which carries
        # the agent's API; its NetworkPolicy drops what leaves): not counted there (docs/reward-integrity.md)
        assert "network_attempt" not in r.probes, r
        await sb.kill_all()
        await still_serves(sb)
        return
    assert r.exit_code == 0 and out["tcp"] == out["udp"] == "101", r  # ENETUNREACH
    assert r.probes == {"network_attempt": 3 if out["tcp6"] == "101" else 2}, r
    await _counted_after_the_command(sb, {"network_attempt": 1})


# what honest commands do with signals and sockets, none of it probing: job control, timeout, killing their own
# children and groups, raising in threads, and a localhost TCP and UDP server with its client
HONEST = r"""
set -e
sleep 30 & kill %1 || true
sleep 30 & kill $! ; wait || true
timeout 0.2 sleep 30 || true
python3 - <<'PY'
import os, signal, socket, subprocess, sys, threading
p = subprocess.Popen(["sleep", "30"]); p.terminate(); p.wait()
p = subprocess.Popen(["sleep", "30"], start_new_session=True); os.killpg(p.pid, signal.SIGKILL); p.wait()
p = subprocess.Popen(["sleep", "30"]); os.kill(p.pid, 0); p.kill(); p.wait()
fd = os.pidfd_open(os.getpid()); signal.pidfd_send_signal(fd, 0)
import fcntl, struct
fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid()); fcntl.fcntl(fd, 15, struct.pack("ii", 2, os.getpgid(0)))
fcntl.ioctl(socket.socket(), 0x8901, struct.pack("i", -os.getpgid(0))); fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)
signal.signal(signal.SIGUSR1, lambda *a: None)
os.kill(os.getpid(), signal.SIGUSR1); signal.raise_signal(signal.SIGUSR1)
t = threading.Thread(target=lambda: None); t.start(); t.join()
signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
srv = socket.create_server(("127.0.0.1", 0)); port = srv.getsockname()[1]
threading.Thread(target=lambda: srv.accept()[0].sendall(b"hi")).start()
assert socket.create_connection(("127.0.0.1", port)).recv(2) == b"hi"
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
try:
    socket.create_connection(("127.0.0.1", 1), 1)
except ConnectionRefusedError:
    pass
print("honest")
PY
"""


async def attack_none_honest_signals_and_sockets(sb: Sandbox) -> None:
    """The false-positive check of the two attacks above: no count for any of HONEST."""
    sb.take_observed()
    r = await sb.exec(["bash", "-c", HONEST])
    assert r.exit_code == 0 and r.stdout.endswith("honest\n") and r.probes == {}, r
    await sb.kill_all()
    assert [o.probes for o in sb.take_observed() if o.probes] == [], "counted at kill_all"


PROBE_ATTACKS = (attack_signal_foreign_processes, attack_sigio_to_foreign_processes, attack_signal_after_the_command,
                 attack_reach_the_network,
                 attack_none_honest_signals_and_sockets)
