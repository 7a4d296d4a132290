"""The in-sandbox agent (agent.py) and its client (client.py), without bubblewrap: the agent runs as a plain
process on a unix socket (or tcp + token) in a tmp dir, and every request goes through the real AgentClient."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.errors import SandboxDiedError, SandboxError
from agentrl.sandbox import agent as agent_mod
from agentrl.sandbox.base import AgentEndpoint, SandboxHandle, SandboxSpec
from agentrl.sandbox.client import AgentClient, Sandbox, SandboxFileError, SandboxPathError

AGENT = agent_mod.__file__


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-I", "-S", AGENT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    line = proc.stdout.readline().decode().strip()
    if line != agent_mod.READY_LINE:
        proc.kill()
        raise RuntimeError(f"agent did not start: {line!r} {proc.stderr.read().decode()}")
    return proc


@pytest.fixture
def agent_proc(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    sock, ws = tmp_path / "agent.sock", tmp_path / "ws"
    proc = _start(["--unix", str(sock), "--workspace", str(ws)])
    yield proc, sock, ws
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _sandbox(sock: Path, **spec: object) -> Sandbox:
    handle = SandboxHandle(id="t", backend="test", endpoint=AgentEndpoint(kind="unix", address=str(sock)))
    return Sandbox(handle, SandboxSpec(**spec))


@pytest.fixture
async def sb(agent_proc: tuple[subprocess.Popen, Path, Path]) -> AsyncIterator[Sandbox]:
    sandbox = _sandbox(agent_proc[1], output_limit=4096)
    yield sandbox
    await sandbox.close()


def _gone(pid: int) -> bool:
    """True when `pid` no longer runs (missing, or a zombie waiting for its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# ---------------------------------------------------------------- exec


async def test_health_and_exec_separates_streams(sb: Sandbox) -> None:
    assert await sb.health()
    r = await sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.truncated) == (3, "out\n", "err\n", False, False)


async def test_list_cmd_runs_without_shell_and_cwd_env_stdin(sb: Sandbox, agent_proc) -> None:
    r = await sb.exec(["echo", "$HOME", "a b"])
    assert r.stdout == "$HOME a b\n"
    await sb.write_file("sub/keep.txt", "x")
    r = await sb.exec("pwd; echo $FOO; cat", cwd="sub", env={"FOO": "bar"}, stdin="from stdin")
    assert r.stdout == f"{agent_proc[2].resolve()}/sub\nbar\nfrom stdin"


async def test_large_stdin_is_fed_without_deadlock(sb: Sandbox) -> None:
    data = "y" * (3 * 1024 * 1024)
    r = await sb.exec("wc -c", stdin=data, timeout=20)
    assert r.stdout.strip() == str(len(data))


async def test_missing_command_and_bad_cwd_are_results(sb: Sandbox) -> None:
    r = await sb.exec(["definitely-not-a-command-xyz"])
    assert r.exit_code == 127 and "No such file" in r.stderr
    r = await sb.exec("true", cwd="no/such/dir")
    assert r.exit_code == 1 and "not a directory" in r.stderr


async def test_bad_request_is_value_error(sb: Sandbox) -> None:
    with pytest.raises(ValueError, match="cmd"):
        await sb.exec([])


async def test_timeout_kills_tree_ignoring_sigterm(sb: Sandbox, agent_proc) -> None:
    ws = agent_proc[2]
    script = ("trap '' TERM; (trap '' TERM; sleep 1; echo late > late.txt) & echo child=$!; "
              "sh -c 'trap \"\" TERM; sleep 1; echo late > late2.txt' & echo grandchild=$!; sleep 30")
    r = await sb.exec(script, timeout=0.5)
    assert r.timed_out and r.exit_code is None
    pids = dict(line.split("=") for line in r.stdout.split())  # partial output survives the kill
    assert set(pids) == {"child", "grandchild"}
    await asyncio.sleep(1.5)
    assert not (ws / "late.txt").exists() and not (ws / "late2.txt").exists()
    assert all(_gone(int(p)) for p in pids.values())


async def test_output_is_capped_per_stream(sb: Sandbox) -> None:
    r = await sb.exec("head -c 100000000 /dev/zero | tr '\\0' a; echo tail >&2", timeout=60)
    assert r.exit_code == 0 and r.truncated and not r.timed_out
    assert len(r.stdout) == 4096 and set(r.stdout) == {"a"}
    assert r.stderr == "tail\n"


async def test_background_process_does_not_hang_exec(sb: Sandbox) -> None:
    r = await sb.exec("sleep 30 & echo started", timeout=20)
    assert r.stdout == "started\n" and r.exit_code == 0 and not r.timed_out
    assert r.duration_s < 10


async def test_detached_background_process_survives_between_calls(sb: Sandbox) -> None:
    r = await sb.exec("sleep 20 > /dev/null 2>&1 & echo $!")
    pid = r.stdout.strip()
    assert (await sb.exec(f"kill -0 {pid}")).exit_code == 0
    await sb.exec(f"kill {pid}")


async def test_concurrent_execs_use_separate_connections(sb: Sandbox) -> None:
    slow = asyncio.create_task(sb.exec("sleep 1; echo slow"))
    await asyncio.sleep(0.1)
    fast = await sb.exec("echo fast")
    assert fast.stdout == "fast\n" and not slow.done()
    assert (await slow).stdout == "slow\n"
    assert len(sb.client._idle) == 2  # both connections kept alive for reuse


async def test_keepalive_reuses_one_connection(sb: Sandbox) -> None:
    for _ in range(20):
        await sb.exec(["true"])
    assert len(sb.client._idle) == 1


# ---------------------------------------------------------------- files


async def test_write_read_roundtrip_binary_and_mode(sb: Sandbox, agent_proc) -> None:
    blob = bytes(range(256)) * 10
    await sb.write_file("a/b/blob.bin", blob, mode=0o600)
    assert await sb.read_bytes("a/b/blob.bin") == blob
    assert (agent_proc[2] / "a/b/blob.bin").stat().st_mode & 0o777 == 0o600
    await sb.write_file("t.txt", "héllo")
    assert await sb.read_file("t.txt") == "héllo"
    assert await sb.read_file(str(agent_proc[2].resolve() / "t.txt")) == "héllo"  # absolute inside: fine


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../outside.txt", "link/passwd"])
async def test_paths_outside_workspace_are_refused(sb: Sandbox, agent_proc, path: str) -> None:
    await sb.exec("ln -sf /etc link")
    with pytest.raises(SandboxPathError, match="outside the workspace") as info:
        await sb.read_file(path)
    assert isinstance(info.value, PermissionError)
    with pytest.raises(SandboxPathError):
        await sb.write_file(path, "x")
    assert not (agent_proc[2].parent / "outside.txt").exists()


async def test_write_through_symlink_to_outside_is_refused(sb: Sandbox, tmp_path: Path) -> None:
    target = tmp_path / "host-secret.txt"
    target.write_text("secret")
    await sb.exec(["ln", "-s", str(target), "innocent.txt"])
    with pytest.raises(SandboxPathError):
        await sb.write_file("innocent.txt", "overwritten")
    assert target.read_text() == "secret"


async def test_read_missing_directory_and_fifo(sb: Sandbox) -> None:
    with pytest.raises(FileNotFoundError):
        await sb.read_file("nope.txt")
    await sb.exec("mkdir d && mkfifo fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        await sb.read_file("d")
    with pytest.raises(ValueError, match="not a regular file"):  # would block forever if opened blocking
        await sb.read_file("fifo")
    with pytest.raises(ValueError):
        await sb.write_file("fifo", "x")
    with pytest.raises(ValueError):
        await sb.write_file("d", "x")


# ---------------------------------------------------------------- failures and lifecycle


async def test_agent_gone_raises_sandbox_died(sb: Sandbox, agent_proc) -> None:
    assert await sb.health()
    agent_proc[0].kill()
    agent_proc[0].wait()
    with pytest.raises(SandboxDiedError):
        await sb.exec("echo hi")
    assert not await sb.health()


async def test_sigterm_exits_cleanly_and_kills_running_commands(sb: Sandbox, agent_proc) -> None:
    proc, sock, _ = agent_proc
    running = asyncio.create_task(sb.exec("echo $$; exec sleep 30"))
    await asyncio.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 10) == 0
    with pytest.raises(SandboxDiedError):
        await running
    assert not sock.exists()


async def test_hung_agent_hits_client_deadline(tmp_path: Path) -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    path = str(tmp_path / "hung.sock")
    server = await asyncio.start_unix_server(never_answer, path)
    client = AgentClient(AgentEndpoint(kind="unix", address=path))
    try:
        t0 = time.monotonic()
        with pytest.raises(SandboxDiedError, match="did not answer"):
            await client.request("POST", "/exec", {"cmd": "true"}, timeout=0.3)
        assert time.monotonic() - t0 < 5
    finally:
        await client.close()
        server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_tcp_requires_bearer_token(tmp_path: Path) -> None:
    port = _free_port()
    no_token = subprocess.run([sys.executable, AGENT, "--tcp", f"127.0.0.1:{port}", "--workspace",
                               str(tmp_path / "ws")], capture_output=True, text=True, timeout=30,
                              env={k: v for k, v in os.environ.items() if k != "AGENTRL_AGENT_TOKEN"})
    assert no_token.returncode != 0 and "token" in no_token.stderr
    (tmp_path / "token").write_text("s3cret\n")
    proc = _start(["--tcp", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "token"),
                   "--workspace", str(tmp_path / "ws")])
    try:
        handle = SandboxHandle(id="t", backend="test",
                               endpoint=AgentEndpoint(kind="tcp", address=f"127.0.0.1:{port}", token="s3cret"))
        good = Sandbox(handle, SandboxSpec())
        assert (await good.exec("echo ok")).stdout == "ok\n"
        await good.close()
        bad_handle = SandboxHandle(id="t", backend="test",
                                   endpoint=AgentEndpoint(kind="tcp", address=f"127.0.0.1:{port}", token="wrong"))
        bad = Sandbox(bad_handle, SandboxSpec())
        with pytest.raises(SandboxError, match="token"):
            await bad.exec("echo ok")
        assert not await bad.health()
        await bad.close()
        with pytest.raises(ValueError, match="token"):
            AgentClient(AgentEndpoint(kind="tcp", address=f"127.0.0.1:{port}"))
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- uid separation, leftovers, facts


async def test_health_reports_single_uid_without_run_as(sb: Sandbox) -> None:
    assert await sb.health()
    assert sb.uid_separated is False and sb.command_uid == os.getuid()


async def test_kill_all_without_separation_kills_descendants_daemons_included(sb: Sandbox) -> None:
    r = await sb.exec("setsid sleep 30 > /dev/null 2>&1 < /dev/null & sleep 40 > /dev/null 2>&1 & echo $!")
    pid = int(r.stdout)
    assert not _gone(pid)
    assert await sb.kill_all() >= 2
    assert _gone(pid) and await sb.kill_all() == 0
    r = await sb.exec("sleep 30 > /dev/null 2>&1 & echo $!", kill_leftovers=True)
    assert _gone(int(r.stdout))
    assert (await sb.exec("echo ok")).stdout == "ok\n"


async def test_planted_non_regular_files_are_file_errors(sb: Sandbox) -> None:
    await sb.exec("mkdir d && mkfifo f")
    for path, what in (("d", "directory"), ("f", "FIFO")):
        with pytest.raises(SandboxFileError, match=what) as info:
            await sb.read_file(path)
        assert info.value.kind == "not_regular"


async def test_died_before_the_request_is_not_in_flight(sb: Sandbox, agent_proc) -> None:
    assert await sb.health()  # leaves an idle keep-alive connection
    agent_proc[0].kill()
    agent_proc[0].wait()
    with pytest.raises(SandboxDiedError) as info:  # no sleep: the stale idle connection is noticed by poll()
        await sb.exec("echo hi")
    assert info.value.in_flight is False


async def test_died_during_the_command_is_in_flight(sb: Sandbox, agent_proc) -> None:
    running = asyncio.create_task(sb.exec("sleep 30"))
    await asyncio.sleep(0.3)
    agent_proc[0].kill()
    with pytest.raises(SandboxDiedError) as info:
        await running
    assert info.value.in_flight is True


@pytest.fixture
def separated(tmp_path: Path) -> Iterator[tuple[Sandbox, subprocess.Popen, Path, int]]:
    """An agent with --run-as a uid no other process on this host uses (kill(-1) as that uid hits nothing else)."""
    if os.geteuid() != 0:
        pytest.skip("--run-as needs root")
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="agrl-sep-", dir="/tmp"))
    base.chmod(0o711)  # the command user must traverse to the workspace
    uid = 60000 + os.getpid() % 5000
    proc = _start(["--unix", str(base / "a.sock"), "--workspace", str(base / "ws"), "--run-as", f"{uid}:{uid}"])
    yield _sandbox(base / "a.sock"), proc, base / "ws", uid
    proc.kill()
    proc.wait()
    subprocess.run(["rm", "-rf", str(base)], check=False)


async def test_run_as_separates_commands_and_files_from_the_agent(separated) -> None:
    sb, proc, ws, uid = separated
    assert await sb.health() and sb.uid_separated and sb.command_uid == uid
    r = await sb.exec(f"id -u; id -G; kill -9 {proc.pid}; cat /proc/{proc.pid}/environ")
    assert r.stdout.split() == [str(uid), str(uid)] and "not permitted" in r.stderr and "denied" in r.stderr, r
    await sb.write_file("a/b.txt", "x")
    assert (ws / "a" / "b.txt").stat().st_uid == (ws / "a").stat().st_uid == ws.stat().st_uid == uid
    (ws / "root-only.txt").write_text("secret")  # the host (root) plants a file the command user may not read
    (ws / "root-only.txt").chmod(0o600)
    with pytest.raises(SandboxPathError, match="not accessible"):  # file requests run with the command user's fsuid
        await sb.read_file("root-only.txt")
    r = await sb.exec("(setsid sh -c 'while :; do sleep 0.05; done' &) ; echo started")
    assert await sb.kill_all() >= 1 and await sb.kill_all() == 0
    assert (await sb.exec("echo ok")).stdout == "ok\n" and proc.poll() is None
    await sb.close()
