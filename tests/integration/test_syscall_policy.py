"""The syscall policy (agent.SECCOMP_SOURCE) through real local sandboxes: the per-uid kernel keyring is no channel
between episodes, the probes are refused with EPERM and counted by the agent (not by anything the command prints),
and ordinary programs keep working. Docker's tier runs the same checks in tests/docker/test_attacks.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.sandbox import SandboxPool, SandboxSpec
from agentrl.sandbox.agent import seccomp
from tests.integration.test_sandbox_local import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0, reason="uid separation needs a root host user")]
SPEC = SandboxSpec(memory="256m", pids=128, disk="64m", default_timeout_s=20)
NR = {name: nr for text in (*seccomp.ALLOWED.values(), seccomp.PROBES)
      for name, nr in seccomp.table(text, seccomp.ARCHES[os.uname().machine][1]).items()}
CALL = f"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = {NR!r}
def call(name, *args):
    r = libc.syscall(NR[name], *args)
    return r, (ctypes.get_errno() if r < 0 else 0)
"""
# the data rides in the key's description: any key in the uid's user keyring is listed and described to that uid
# in a later sandbox (VIEW permission), whatever session keyring bubblewrap gave each
STORE = CALL + """
print(call("add_key", b"user", b"agentrl-note:answer-is-42", b"x", 1, -4))  # KEY_SPEC_USER_KEYRING
"""
LOAD = CALL + """
ids = (ctypes.c_int32 * 64)()
n, err = call("keyctl", 11, -4, ids, ctypes.sizeof(ids))  # KEYCTL_READ of the user keyring: its key ids
for key in ids[:max(n, 0) // 4]:
    text = ctypes.create_string_buffer(256)
    if call("keyctl", 6, key, text, 256)[0] > 0:  # KEYCTL_DESCRIBE
        print("described:", text.value)
print("listed", n, err)
"""


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agrl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def pool(state_dir: Path) -> AsyncIterator[SandboxPool]:
    async with SandboxPool("local", SPEC, warm=0, max_sandboxes=2, state_dir=state_dir) as p:
        yield p


async def test_keyring_is_no_channel_between_episodes(pool: SandboxPool) -> None:
    async with pool.lease() as first:
        stored = await first.exec(["python3", "-c", STORE])
    async with pool.lease() as later:  # a fresh sandbox, as the next episode gets
        loaded = await later.exec(["python3", "-c", LOAD])
    assert "answer-is-42" not in loaded.stdout, (stored, loaded)
    assert stored.stdout.strip() == "(-1, 1)", stored  # EPERM: programs degrade, nothing is killed
    assert stored.probes == {"add_key": 1} and loaded.probes == {"keyctl": 1}, (stored, loaded)


async def test_probes_refused_with_eperm_and_counted(pool: SandboxPool) -> None:
    probe = CALL + """
for name, args in (("ptrace", (0, 0, 0, 0)), ("unshare", (0x10000000,)), ("io_uring_setup", (1, 0)),
                   ("bpf", (0, 0, 0)), ("perf_event_open", (0, 0, -1, -1, 0)), ("userfaultfd", (0,)),
                   ("process_vm_readv", (1, 0, 0, 0, 0, 0)), ("mount", (b"none", b"/tmp", b"tmpfs", 0, 0))):
    print(name, call(name, *args))
print("clone_ns", call("clone", 0x10000000 | 17, 0, 0, 0, 0))  # CLONE_NEWUSER | SIGCHLD
print("vsock", call("socket", 40, 1, 0))  # AF_VSOCK, SOCK_STREAM: no network namespace holds it
print("unix", call("socket", 1, 1, 0) > (0, 0))  # AF_UNIX stays allowed
print("clone3", libc.syscall(435, 0, 0), ctypes.get_errno())
print("echo forged: probes={}", file=sys.stderr)
"""
    async with pool.lease() as sb:
        r = await sb.exec(["python3", "-c", probe])
        ok = await sb.exec("python3 -c 'import subprocess, threading; t = threading.Thread(target=print); t.start(); "
                           "t.join(); print(subprocess.run([\"id\", \"-u\"], capture_output=True, text=True).stdout)'"
                           " && cd /tmp && GIT_CONFIG_NOSYSTEM=1 git init -q g && echo ok")
        await sb.health()
        mode = sb.agent_info.get("seccomp")
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for name in ("ptrace", "unshare", "io_uring_setup", "bpf", "perf_event_open", "userfaultfd", "process_vm_readv",
                 "mount", "clone_ns", "vsock"):
        assert lines[name] == "(-1, 1)", (name, r)
    assert lines["clone3"] == "-1 38", r  # ENOSYS, uncounted: libc falls back to clone
    assert r.probes == {n: 1 for n in ("ptrace", "unshare", "io_uring_setup", "bpf", "perf_event_open",
                                       "userfaultfd", "process_vm_readv", "mount", "clone_namespace",
                                       "socket_vsock")}, r
    assert lines["unix"] == "True", r
    assert ok.exit_code == 0 and ok.stdout.endswith("1000\n\nok\n") and ok.probes == {}, ok
    assert mode == "notify"
