"""Limits and isolation of docker sandboxes, exercised through the agent exactly as tools use them: memory and pids
cgroups, disk, output caps, no network, nothing of the host visible, an unprivileged user."""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

PROC_COUNT = "ls -d /proc/[0-9]* | wc -l"


async def test_runs_unprivileged_on_a_read_only_root(make_sandbox) -> None:
    async with make_sandbox() as sb:
        r = await sb.exec("id -u; id -g; grep -E '^(CapEff|CapPrm|CapAmb|CapBnd|NoNewPrivs|Seccomp):' "
                          "/proc/self/status")
        assert r.exit_code == 0, r
        lines = r.stdout.split()
        assert lines[:2] == ["1000", "1000"]
        status = dict(zip(lines[2::2], lines[3::2]))
        # no capability at all; the bounding set is the agent's (KILL, SETGID, SETUID when uid-separated), which
        # no_new_privs keeps out of reach (no setuid binary or file capability takes effect)
        bounding = "00000000000000e0" if sb.uid_separated else "0000000000000000"
        assert status == {"CapEff:": "0000000000000000", "CapPrm:": "0000000000000000",
                          "CapAmb:": "0000000000000000", "CapBnd:": bounding, "NoNewPrivs:": "1",
                          "Seccomp:": "2"}, r.stdout  # 2 = a seccomp filter (Docker's default profile)
        for path in ("/var/tmp/x", "/agentrl/agent.pyz"):  # /var/tmp is world-writable in the image
            w = await sb.exec(f"echo x > {path}")
            assert w.exit_code != 0 and "Read-only file system" in w.stderr, w
        for path in ("/etc/x", "/usr/lib/x", "/root/x"):
            assert (await sb.exec(f"echo x > {path}")).exit_code != 0


async def test_memory_bomb_is_killed_by_the_cgroup_and_reported(make_sandbox, backend) -> None:
    async with make_sandbox(memory="128m") as sb:
        assert await backend.oom_kills(sb.handle) == 0
        bomb = "python3 -c 'b = []\nwhile True: b.append(bytearray(16 << 20))'"
        r = await sb.exec(bomb, timeout=60)
        assert not r.timed_out, r
        assert r.exit_code in (-9, 137), r  # SIGKILL from the OOM killer (the agent reports -signal)
        deadline = asyncio.get_running_loop().time() + 10
        while await backend.oom_kills(sb.handle) < 1:  # the 'oom' event reaches dockerd asynchronously
            assert asyncio.get_running_loop().time() < deadline, "no OOM event reported for the container"
            await asyncio.sleep(0.2)
        after = await sb.exec("echo still here")  # only the bomb died; the agent and the sandbox live on
        assert after.exit_code == 0 and after.stdout == "still here\n"


async def test_fork_bomb_is_contained_by_the_pids_limit(make_sandbox) -> None:
    async with make_sandbox(pids=64) as sb:
        spawn = ("python3 -c 'import subprocess\nn = 0\ntry:\n    while n < 1000:\n"
                 "        subprocess.Popen([\"sleep\", \"60\"]); n += 1\nexcept OSError as e:\n    print(n, e.errno)'")
        r = await sb.exec(spawn, timeout=30)
        count, errno = r.stdout.split()
        assert int(count) < 64 and errno == "11", r  # EAGAIN from fork once pids.max is reached
        bomb = await sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=5)
        assert bomb.exit_code is not None or bomb.timed_out
        r = await sb.exec(f"sleep 1; {PROC_COUNT}")  # the agent killed the bomb's process group
        assert r.exit_code == 0 and int(r.stdout) < 10, r


async def test_disk_fill_is_stopped(make_sandbox) -> None:
    async with make_sandbox(disk="32m") as sb:
        r = await sb.exec("dd if=/dev/zero of=fill bs=1M count=200", timeout=60)
        assert r.exit_code != 0 and "No space left on device" in r.stderr, r
        du = await sb.exec("du -sk /workspace | cut -f1")
        assert int(du.stdout) <= 32 * 1024
        tmp = await sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=200", timeout=60)
        assert tmp.exit_code != 0 and "No space left on device" in tmp.stderr, tmp
        ok = await sb.exec("rm fill /tmp/fill && echo ok > small && cat small")
        assert ok.stdout == "ok\n"  # freeing space makes the workspace writable again


async def test_one_gigabyte_of_output_is_capped(make_sandbox) -> None:
    async with make_sandbox(output_limit=64 * 1024) as sb:
        r = await sb.exec("head -c 1073741824 /dev/zero | tr '\\0' a; echo done >&2", timeout=300)
        assert r.exit_code == 0 and not r.timed_out, (r.exit_code, r.stderr)
        assert r.truncated
        assert len(r.stdout) == 64 * 1024 and set(r.stdout) == {"a"}
        assert r.stderr == "done\n"


def _listen_on_all_interfaces() -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("0.0.0.0", 0))
    srv.listen(8)
    return srv


GATEWAY = ("python3 -c 'import socket, struct\nfor line in open(\"/proc/net/route\").readlines()[1:]:\n"
           "    f = line.split()\n    if f[1] == \"00000000\": print(socket.inet_ntoa(struct.pack(\"<I\", "
           "int(f[2], 16))))'")


CONNECT = ("python3 -c 'import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), "
           "timeout=3).close(); print(\"connected\")\nexcept OSError as e:\n    print(\"refused\", e)' {} {}")

UNIX_CONNECT = ("python3 -c 'import socket, sys\ntry:\n    socket.socket(socket.AF_UNIX).connect(sys.argv[1]); "
                "print(\"connected\")\nexcept OSError as e:\n    print(\"refused\", e)' {}")


async def test_network_is_unreachable_unless_opted_in(make_sandbox) -> None:
    srv = _listen_on_all_interfaces()
    port = srv.getsockname()[1]
    try:
        async with make_sandbox(network=True) as sb:  # the opt-in: the host's bridge address is reachable
            gateway = (await sb.exec(GATEWAY)).stdout.strip()
            assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", gateway), gateway
            r = await sb.exec(CONNECT.format(gateway, port), timeout=20)
            assert r.stdout == "connected\n", r
        async with make_sandbox() as sb:  # the default: only loopback, nothing reachable
            ifaces = await sb.exec("ls /sys/class/net")
            assert ifaces.stdout.split() == ["lo"]
            for host, p in ((gateway, port), ("1.1.1.1", 53)):
                r = await sb.exec(CONNECT.format(host, p), timeout=20)
                assert r.stdout.startswith("refused"), r
            dns = await sb.exec("python3 -c 'import socket; socket.getaddrinfo(\"deb.debian.org\", 80)'")
            assert dns.exit_code != 0
    finally:
        srv.close()


async def test_host_processes_and_the_docker_socket_are_out_of_reach(make_sandbox, monkeypatch) -> None:
    secret = secrets.token_hex(16)
    monkeypatch.setenv("AGENTRL_TEST_SECRET", secret)  # in this (host) process's environment, not the sandbox's
    try:
        host_init_env = Path("/proc/1/environ").read_bytes()
    except OSError:  # not readable even here (this host process may itself be confined): the secret suffices
        host_init_env = b""
    async with make_sandbox() as sb:
        r = await sb.exec("cat /proc/1/environ; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; "
                          "cat /proc/1/cmdline | tr '\\0' ' '")
        assert secret not in r.stdout
        assert "docker-init" in r.stdout  # pid 1 is the container's own init, not the host's
        for line in host_init_env.split(b"\0"):
            if line and not re.match(rb"^(PATH|HOME|TERM|HOSTNAME|LANG)=", line):
                assert line.decode(errors="replace") not in r.stdout
        procs = await sb.exec(PROC_COUNT)
        assert int(procs.stdout) < 10  # its own pid namespace
        for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
            probe = await sb.exec(UNIX_CONNECT.format(path))
            assert probe.stdout.startswith("refused"), (path, probe)
        assert (await sb.exec("ls /var/run/docker.sock")).exit_code != 0
