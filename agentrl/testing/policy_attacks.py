"""Attacks on what the syscall policy and the agent's counters observe (agentrl/sandbox/agent.py, SECCOMP_SOURCE and
ResourceCounters), as reusable checks that every tier runs through `sandbox_attacks.ALL` / `RESOURCE_ATTACKS`:
probes of kernel interfaces a task never needs are refused and counted, and an OOM kill the exit code hides is
counted. Imports nothing but the sandbox client types.
"""

from __future__ import annotations

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
