"""The in-sandbox agent (the package agentrl/sandbox/agent, run as its artifact agent.pyz) and its client (client.py),
without bubblewrap: the agent runs as a plain process on a unix socket (or tcp + token) in a tmp dir, and every
request goes through the real AgentClient."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.errors import SandboxDiedError, SandboxError
from agentrl.sandbox import artifact as agent_artifact
from agentrl.sandbox.agent import bodies, paths, protocol, server
from agentrl.sandbox.base import AgentEndpoint, SandboxHandle, SandboxSpec
from agentrl.sandbox.client import AgentClient, Sandbox, SandboxFileError, SandboxPathError

AGENT = str(agent_artifact.artifact_path())  # what every backend ships: python3 -I -S agent.pyz ARGS
PKG_PARENT = str(agent_artifact.PACKAGE_DIR.parent)  # on sys.path, `import agent` gets the package as in the artifact


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-I", "-S", AGENT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    line = proc.stdout.readline().decode().strip()
    if line != protocol.READY_LINE:
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


@pytest.fixture
async def hung_client(tmp_path: Path) -> AsyncIterator[AgentClient]:
    """A client of an "agent" that accepts requests and never answers."""
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    path = str(tmp_path / "hung.sock")
    server = await asyncio.start_unix_server(never_answer, path)
    client = AgentClient(AgentEndpoint(kind="unix", address=path))
    yield client
    await client.close()
    server.close()


@pytest.mark.parametrize("stall_s", [0.0, 1.0])
async def test_hung_agent_hits_client_deadline(hung_client: AgentClient, stall_s: float) -> None:
    """Also after a stall of the runner's loop past the deadline: it is extended once, by the stall, not forever."""
    t0 = time.monotonic()
    if stall_s:
        asyncio.get_running_loop().call_later(0.1, time.sleep, stall_s)
    with pytest.raises(SandboxDiedError, match="did not answer") as info:
        await hung_client.request("POST", "/exec", {"cmd": "true"}, timeout=0.3)
    assert info.value.in_flight is True and time.monotonic() - t0 < 5


async def test_an_answer_that_arrived_while_the_runners_loop_stalled_is_read_not_judged_hung(sb: Sandbox) -> None:
    """The agent answers at ~0.3 s; the runner's loop is blocked from 0.1 s to 2.1 s, past the 0.8 s deadline. The
    answer sits in the socket when the late timer fires: it is read (with asyncio.timeout the request was judged
    hung, SandboxDiedError in flight: a "missed deadline" charged to the policy for the runner's own stall)."""
    assert await sb.health()  # connected: the request below only writes and waits
    payload = {"cmd": "sleep 0.3; echo done", "timeout": 5, "output_limit": 4096}
    asyncio.get_running_loop().call_later(0.1, time.sleep, 2.0)
    status, obj = await sb.client.request("POST", protocol.EXEC, payload, timeout=0.8)
    assert status == 200 and obj["stdout"] == "done\n"


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


NO_EXEC_PER_COMMAND = """
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from agent import handlers, identity as ids, server
started = []

class Recording(subprocess.Popen):
    def __init__(self, args, *a, **k):
        super().__init__(args, *a, **k)
        started.append({"pid": self.pid, "argv": [str(x)[:40] for x in args]})

subprocess.Popen = Recording  # every Popen of the agent's modules
identity = ids.Identity((int(sys.argv[3]), int(sys.argv[3])))
libc = ids.prctl_setup()
identity.setup(libc, sys.argv[2])
a = handlers.Agent(sys.argv[2], identity, libc=libc)
out = [server._handle(a, "POST", "/exec", json.dumps({"cmd": c}).encode())[1]
       for c in (["id", "-u"], ["true"], "echo $PPID; cat /proc/self/oom_score_adj", ["no-such-command-x"],
                 "grep -E '^(Cap(Inh|Prm|Eff|Amb)|NoNewPrivs|Groups):' /proc/self/status")]
print(json.dumps({"results": out, "popen": started}))
"""


def test_separated_commands_start_without_an_exec_of_setpriv_per_command(separated) -> None:
    """uid-separated, a command costs one spawn + exec by the spawner (started once, already the command user: the
    commands' parent), never a Popen of setpriv per command; it is still OOM-first, and exec errors are still
    126/127 results."""
    sb, proc, ws, uid = separated
    out = subprocess.run([sys.executable, "-I", "-c", NO_EXEC_PER_COMMAND, PKG_PARENT, str(ws),
                          str(uid)], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    ident, true, parent, missing, privileges = report["results"]
    assert ident["exit_code"] == 0 and ident["stdout"] == f"{uid}\n", report
    assert missing["exit_code"] in (126, 127) and "no-such-command-x" in missing["stderr"], report
    assert len(report["popen"]) == 1 and not any("setpriv" in a for a in report["popen"][0]["argv"]), report
    assert true["exit_code"] == 0 and parent["stdout"].split() == [str(report["popen"][0]["pid"]), "1000"], report
    fields = dict(line.split(":", 1) for line in privileges["stdout"].splitlines())  # as setpriv's options gave
    assert {k: v.strip() for k, v in fields.items()} == {"Groups": "", "NoNewPrivs": "1", "CapInh": "0" * 16,
                                                          "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16}


async def test_a_command_that_kills_its_spawner_at_once_keeps_its_result(separated) -> None:
    """`kill -9 -1` as a command's first act kills the spawner, often before the spawner answered the agent: the
    agent then finds the command among its re-parented children (by its stdout pipe) and still returns its output
    and exit code; the next exec gets a fresh spawner."""
    sb, proc, ws, uid = separated
    for i in range(8):  # still running when the agent looks for it, or already exited
        r = await sb.exec(f"kill -9 -1; {'sleep 0.2; ' if i % 2 else ''}echo survived {i}; exit 3")
        assert (r.exit_code, r.stdout) == (3, f"survived {i}\n"), r
    assert (await sb.exec("echo ok")).stdout == "ok\n" and proc.poll() is None
    await sb.close()


# ---------------------------------------------------------------- hostile paths (issue 22)

CHAIN = ("import os\nos.makedirs('links', exist_ok=True)\nos.symlink('../target.py', 'links/{path}0')\n"
         "for i in range(1, {n}):\n    os.symlink(f'{path}{{i-1}}', f'links/{path}{{i}}')\n"
         "os.symlink(f'links/{path}{{{n} - 1}}', {path!r})\nopen('target.py', 'w').write('x = 1')\n")


async def test_a_symlink_chain_or_loop_is_a_path_error_not_an_agent_error(sb: Sandbox) -> None:
    """1,200 links (os.path.realpath recursed: RecursionError, 500, infra) and a loop: 400 bad_path, the policy's."""
    assert (await sb.exec(["python3", "-c", CHAIN.format(n=1200, path="solution.py")])).exit_code == 0
    assert (await sb.exec("ln -s loop-b loop-a && ln -s loop-a loop-b")).exit_code == 0
    for path in ("solution.py", "loop-a", "loop-a/x.py"):
        with pytest.raises(SandboxPathError, match="more than 40 symbolic links") as info:
            await sb.read_file(path)
        assert isinstance(info.value, PermissionError) and not isinstance(info.value, SandboxError)
        with pytest.raises(SandboxPathError, match="symbolic links"):
            await sb.write_file(path, "y")
    assert (await sb.exec(["python3", "-c", CHAIN.format(n=30, path="short.py")])).exit_code == 0
    assert await sb.read_file("short.py") == "x = 1"  # a chain within the kernel's limit still resolves
    await sb.write_file("short.py", "x = 2")
    assert await sb.read_file("target.py") == "x = 2"
    assert (await sb.exec("echo alive")).stdout == "alive\n"


@pytest.mark.parametrize("path", ["bad\x00name.py", "a/" * 2100 + "x.py", "\ud800.py"])
async def test_unresolvable_request_paths_are_path_errors(sb: Sandbox, path: str) -> None:
    with pytest.raises(SandboxPathError):
        await sb.read_file(path)
    with pytest.raises(SandboxPathError):
        await sb.write_file(path, "x")
    assert await sb.health()


async def test_sparse_giant_file_and_device_link_never_hang_or_allocate(sb: Sandbox) -> None:
    await sb.exec("truncate -s 1T giant.py && ln -s /dev/zero zero.py && ln -s /proc/self/fd/0 fd.py")
    async with asyncio.timeout(10):
        with pytest.raises(SandboxFileError, match="larger than") as info:
            await sb.read_file("giant.py")
        assert info.value.kind == "too_large"
        for path in ("zero.py", "fd.py"):
            with pytest.raises(SandboxPathError):
                await sb.read_file(path)


def _hwm_kib(pid: int) -> int:
    return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmHWM:")).split()[1])


async def test_a_100_mb_round_trip_leaves_the_agents_peak_memory_flat(sb: Sandbox, agent_proc) -> None:
    """The agent carries files in FILE_CHUNK pieces, so its peak memory does not depend on their size: a 100 MB
    write and read back (byte-exact) raise its VmHWM by far less than the file. (The old JSON /write held the
    base64 body and the decoded bytes, the old /read the whole file: over 200 MB of peak for this round trip; an
    agent in a 256 MiB container of its own died of it.)"""
    size = 100 * 1024 * 1024
    blob = os.urandom(1 << 20) * 100
    before = _hwm_kib(agent_proc[0].pid)
    await sb.write_file("big.bin", blob)
    assert (agent_proc[2] / "big.bin").stat().st_size == size
    data = await sb.read_bytes("big.bin")
    assert len(data) == size and data == blob
    grew = (_hwm_kib(agent_proc[0].pid) - before) * 1024
    assert grew < 16 * 1024 * 1024, f"the agent's peak memory grew by {grew / 2**20:.0f} MiB for a 100 MB file"


async def test_a_refused_big_write_keeps_the_connection_in_step(sb: Sandbox, agent_proc) -> None:
    """A write refused after its body started (a path outside the workspace, 3 MiB of body already on the way) is
    answered once the rest of the body was read and dropped: the same keep-alive connection serves the next request,
    and empty and odd-sized files round-trip exactly."""
    with pytest.raises(SandboxPathError):
        await sb.write_file("../outside.bin", os.urandom(3 << 20) + b"tail")
    assert len(sb.client._idle) == 1  # the connection was kept, not dropped
    assert (await sb.exec("echo alive")).stdout == "alive\n"
    for n in (0, 1, (1 << 20) - 1, (1 << 20) + 1):
        blob = os.urandom(n)
        await sb.write_file(f"odd{n}.bin", blob, mode=0o600)
        assert await sb.read_bytes(f"odd{n}.bin") == blob
        assert (agent_proc[2] / f"odd{n}.bin").stat().st_mode & 0o777 == 0o600


async def test_an_agent_without_the_file_routes_is_a_version_error_not_a_missing_file(tmp_path: Path) -> None:
    """An agent of protocol version 1 (JSON /write and /read) answers GET /file with 404 "no route": the client
    says the agent speaks another version (SandboxError), never "no such file" (which would read as the policy's)."""
    async def old_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")),
                          b"0"))
        await reader.readexactly(length)
        body = b'{"error": "no route GET /file?path=x&max=1"}'
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(old_agent, str(tmp_path / "old.sock"))
    async with server:
        sb = Sandbox(SandboxHandle(id="t", backend="test",
                                   endpoint=AgentEndpoint(kind="unix", address=str(tmp_path / "old.sock"))),
                     SandboxSpec())
        with pytest.raises(SandboxError, match="another version"):
            await sb.read_bytes("x")
        await sb.close()


def _sent(body: bodies.FileBody) -> bytes:
    """What FileBody.send puts on a connection (read by a thread while it sends)."""
    a, b = socket.socketpair()
    got = bytearray()

    def pump() -> None:
        while data := b.recv(1 << 20):
            got.extend(data)

    reader = threading.Thread(target=pump)
    reader.start()
    with a, b:
        body.send(a, b"")
        a.shutdown(socket.SHUT_WR)
        reader.join(30)
    return bytes(got)


@pytest.mark.parametrize("change", ["shrinks", "grows", "stays"])
def test_a_file_that_changes_size_while_read_is_never_a_short_file(tmp_path: Path, change: str) -> None:
    """GET /file's length is fixed by fstat once the file is open; a file that shrinks or grows before its bytes
    are all sent still gets exactly its announced length, ending with the "changed" status byte (zero-padded when
    it shrank): the host never waits for missing bytes, and never takes a short file for the whole one."""
    path = tmp_path / "moving.bin"
    path.write_bytes(b"x" * (3 << 20))
    fd = os.open(path, os.O_RDONLY)
    body = bodies.FileBody(fd, os.fstat(fd).st_size)
    if change == "shrinks":
        os.truncate(path, 1000)
    elif change == "grows":
        with path.open("ab") as f:
            f.write(b"more")
    out = _sent(body)
    assert len(out) == (3 << 20) + 1 and body.fd == -1
    assert out[-1:] == (b"." if change == "stays" else b"!")
    if change == "shrinks":
        assert out[:1000] == b"x" * 1000 and out[1000:-1] == bytes(len(out) - 1001)


async def test_the_client_refuses_a_file_marked_changed(tmp_path: Path) -> None:
    """The host side of the rule above: an answer ending in the "changed" byte is a file error (the policy's
    doing: only its processes change files in the workspace), never bytes handed to the caller."""
    async def changed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 4\r\n\r\nab\0!")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(changed, str(tmp_path / "s.sock"))
    async with server:
        sb = Sandbox(SandboxHandle(id="t", backend="test",
                                   endpoint=AgentEndpoint(kind="unix", address=str(tmp_path / "s.sock"))),
                     SandboxSpec())
        with pytest.raises(SandboxFileError) as info:
            await sb.read_bytes("x")
        assert info.value.kind == "changed_while_read"
        await sb.close()


# ---------------------------------------------------------------- connections (issue 22)


def _tcp_agent(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, int, Sandbox]:
    port = _free_port()
    (tmp_path / "token").write_text("s3cret\n")
    proc = _start(["--tcp", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "token"),
                   "--workspace", str(tmp_path / "ws"), *extra])
    handle = SandboxHandle(id="t", backend="test",
                           endpoint=AgentEndpoint(kind="tcp", address=f"127.0.0.1:{port}", token="s3cret"))
    return proc, port, Sandbox(handle, SandboxSpec())


def _threads(pid: int) -> int:
    return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("Threads:")).split()[1])


async def test_a_connection_flood_costs_no_threads_and_authorized_requests_are_served(tmp_path: Path) -> None:
    """Hundreds of raw connections held open (silent, half a request head, a whole head with a wrong token) from
    inside the sandbox: the agent's threads stay bounded and a request with the token is answered."""
    proc, port, sb = _tcp_agent(tmp_path)
    flood: list[socket.socket] = []
    try:
        assert (await sb.exec("echo before")).stdout == "before\n"
        for i in range(600):
            s = socket.create_connection(("127.0.0.1", port))
            if i % 3 == 1:
                s.sendall(b"POST /exec HTTP/1.1\r\nHost: agent\r\n")  # never finishes its head
            elif i % 3 == 2:
                s.sendall(b"GET /health HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n")
            flood.append(s)
        await asyncio.sleep(0.5)
        assert _threads(proc.pid) <= 40, "a thread per unauthenticated connection"  # 32 workers at most
        fresh = Sandbox(sb.handle, SandboxSpec())  # a new connection while the flood is held
        async with asyncio.timeout(10):
            assert (await fresh.exec("echo during")).stdout == "during\n"
            assert (await sb.exec("echo kept")).stdout == "kept\n"  # the authorized keep-alive connection
        await fresh.close()
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert fds <= 128 + 32 + 32, fds  # pending + workers + the agent's own
        flood[2].settimeout(5)
        assert flood[2].recv(4096).startswith(b"HTTP/1.1 401")  # a wrong token is answered and dropped
        flood[0].settimeout(5)
        assert flood[0].recv(4096) == b""  # the oldest silent connections were pushed out
    finally:
        for s in flood:
            s.close()
        await sb.close()
        proc.kill()
        proc.wait()


async def test_a_silent_connection_is_closed_after_the_handshake_timeout(tmp_path: Path) -> None:
    proc, port, sb = _tcp_agent(tmp_path, "--handshake-timeout", "0.5")
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            t0 = time.monotonic()
            assert s.recv(100) == b""
            assert time.monotonic() - t0 < 4
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    finally:
        await sb.close()
        proc.kill()
        proc.wait()


def _raw_roundtrip(sock_path: Path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock_path))
        s.sendall(request)
        return s.recv(65536)


@pytest.mark.parametrize("request_bytes, status", [
    (b"POST /exec HTTP/1.1\r\nContent-Length: -1\r\n\r\n{}", b"400"),  # used to read to EOF: a hang
    (b"POST /exec HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n{}", b"400"),
    (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n", b"431"),
    (b"GET /health HTTP/1.1\r\nX: " + b"y" * 20000 + b"\r\n\r\n", b"431"),
])
def test_malformed_or_oversized_requests_are_answered_not_hung(agent_proc, request_bytes: bytes,
                                                               status: bytes) -> None:
    answer = _raw_roundtrip(agent_proc[1], request_bytes)
    assert answer.split()[1] == status, answer[:200]
    assert b"200" in _raw_roundtrip(agent_proc[1], b"GET /health HTTP/1.1\r\n\r\n")[:20]


async def test_an_idle_connection_is_not_reused_past_its_age(sb: Sandbox, monkeypatch) -> None:
    from agentrl.sandbox import client as client_mod

    await sb.exec(["true"])
    first = sb.client._idle[0]
    await sb.exec(["true"])
    assert sb.client._idle == [first]
    monkeypatch.setattr(client_mod, "IDLE_REUSE_S", 0.0)  # the agent may close what is idle this long
    await sb.exec(["true"])
    assert sb.client._idle and sb.client._idle[0] is not first


# ---------------------------------------------------------------- exec grace, kill survivors (issue 22)


async def test_a_command_that_leaves_nothing_behind_never_pays_the_exit_grace(tmp_path: Path) -> None:
    """With a 2 s grace, plain commands return at once; one whose background child holds the pipes returns at the
    main process's exit + the grace (and the child is killed), not at the child's end."""
    sock = tmp_path / "a.sock"
    proc = _start(["--unix", str(sock), "--workspace", str(tmp_path / "ws"), "--exit-grace", "2"])
    sb = _sandbox(sock)
    try:
        for cmd in (["true"], "true", "echo hi; echo err >&2", "(sleep 0.05; echo late) &", "exit 3"):
            t0 = time.monotonic()
            r = await sb.exec(cmd)
            assert time.monotonic() - t0 < 1.0, (cmd, r)
        t0 = time.monotonic()
        r = await sb.exec("sleep 30 & echo $!")
        assert 2.0 <= time.monotonic() - t0 < 10 and r.exit_code == 0, r
        await asyncio.sleep(0.2)
        assert _gone(int(r.stdout))
    finally:
        await sb.close()
        proc.kill()
        proc.wait()


SURVIVORS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from agent import handlers, server
handlers.KILL_ALL_DEADLINE_S = 0.2
handlers.descendants = lambda: {4194999}  # a process that never goes away, as one stuck in the kernel
a = handlers.Agent(sys.argv[2])
print(json.dumps(server._handle(a, "POST", "/kill_all", b"{}")))
"""


def test_processes_that_survive_kill_all_are_a_409_not_a_500(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-I", "-c", SURVIVORS, PKG_PARENT, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    status, body = json.loads(out.stdout)
    assert status == 409 and body["kind"] == "survivors", out
    assert body["error"].startswith("policy processes survived kill")


async def test_survivors_are_the_policys_doing_for_the_client_and_attribution(tmp_path: Path) -> None:
    from agentrl.errors import PolicyError
    from agentrl.runner.attribution import Stage, classify
    from agentrl.sandbox.client import SandboxSurvivorsError

    body = json.dumps({"error": "policy processes survived kill: 1 process(es)", "kind": "survivors"}).encode()

    async def agent_409(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    path = str(tmp_path / "409.sock")
    server = await asyncio.start_unix_server(agent_409, path)
    sb = _sandbox(Path(path))
    try:
        with pytest.raises(SandboxSurvivorsError, match="survived kill") as info:
            await sb.kill_all()
    finally:
        await sb.close()
        server.close()
    assert isinstance(info.value, PolicyError) and not isinstance(info.value, SandboxError)
    for stage in (Stage.turns, Stage.finalize):
        verdict = classify(info.value, stage)
        assert not verdict.infra and verdict.kind == "processes_survived_kill", verdict


def test_a_symlink_swapped_in_after_resolution_is_refused_not_followed(tmp_path: Path) -> None:
    """Between resolving a path and opening it a command may replace a directory on it by a symlink out of the
    workspace: the open (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) refuses it; O_NOFOLLOW alone guards only the
    last component and would have opened the file outside."""
    if not paths._Openat2.usable():
        pytest.skip("openat2 is not available on this kernel (the agent falls back to O_NOFOLLOW)")
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (root / "sub").symlink_to(tmp_path)  # was a directory when the path was resolved
    with pytest.raises(protocol.HTTPError) as info:
        paths.open_regular(str(root / "sub" / "secret.txt"), (str(root),), os.O_RDONLY, 0, "sub/secret.txt")
    assert (info.value.status, info.value.kind) == (400, "bad_path")
    (root / "ok.txt").write_text("fine")
    fd = paths.open_regular(str(root / "ok.txt"), (str(root),), os.O_RDONLY, 0, "ok.txt")
    assert os.read(fd, 10) == b"fine"
    os.close(fd)


def test_a_flood_from_inside_cannot_push_out_the_hosts_connection_on_its_way(tmp_path: Path) -> None:
    """The agent listens on 127.0.0.2 (the pod IP); the flood comes from that address (from inside the pod), the
    host side from 127.0.0.1 and sends its request only after 600 flood connections arrived: it is still answered
    (the acceptor pushes out the oldest connection from inside, not the oldest of all)."""
    port = _free_port()
    (tmp_path / "token").write_text("s3cret\n")
    proc = _start(["--tcp", f"127.0.0.2:{port}", "--token-file", str(tmp_path / "token"),
                   "--workspace", str(tmp_path / "ws")])
    flood: list[socket.socket] = []
    try:
        host = socket.create_connection(("127.0.0.2", port), source_address=("127.0.0.1", 0))
        time.sleep(0.2)  # accepted and pending, nothing sent yet (a host whose event loop lags)
        for _ in range(600):
            flood.append(socket.create_connection(("127.0.0.2", port), source_address=("127.0.0.2", 0)))
        time.sleep(0.5)
        host.settimeout(10)
        host.sendall(b"GET /health HTTP/1.1\r\nAuthorization: Bearer s3cret\r\nConnection: close\r\n\r\n")
        assert host.recv(4096).startswith(b"HTTP/1.1 200"), "the host's connection was pushed out by the flood"
        host.close()
    finally:
        for s in flood:
            s.close()
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the agent in a container of its own (kubernetes)


def _relay_layout(tag: str, offset: int) -> tuple[Path, int, str, dict[str, str]]:
    """A dir the command user can traverse, a uid no other process uses, the relay's name, and an environment whose
    `python3` is this interpreter. Needs root (--run-as)."""
    if os.geteuid() != 0:
        pytest.skip("--run-as needs root")
    import tempfile

    base = Path(tempfile.mkdtemp(prefix=f"agrl-{tag}-", dir="/tmp"))
    base.chmod(0o711)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    return base, 60000 + (os.getpid() + offset) % 5000, f"agentrl-{tag}-{os.getpid()}", env


@pytest.fixture
def relayed(tmp_path: Path) -> Iterator[tuple[Sandbox, subprocess.Popen, subprocess.Popen, str, int]]:
    """The kubernetes layout on one host: the relay (RELAY_SOURCE, the sandbox container's main process) and an agent
    with --relay NAME and --run-as a uid no other process uses; `python3` on PATH is this interpreter."""
    base, uid, name, env = _relay_layout("relay", 7)
    relay = subprocess.Popen([sys.executable, "-I", "-S", "-c", agent_artifact.relay_source(), name], env=env)
    time.sleep(0.3)
    proc = _start(["--unix", str(base / "a.sock"), "--workspace", str(base / "ws"), "--run-as", f"{uid}:{uid}",
                   "--relay", name], env=env)
    yield _sandbox(base / "a.sock"), proc, relay, name, uid
    for p in (proc, relay):
        p.kill()
        p.wait()
    subprocess.run(["pkill", "-9", "-U", str(uid)], check=False)
    subprocess.run(["rm", "-rf", str(base)], check=False)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


ASK_RELAY = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
argv = b"\\0".join([b"sh", b"-c", b"echo forged"])
try:
    s.sendall(len(argv).to_bytes(4, "little") + argv)
    s.settimeout(5)
    print("answer", len(s.recv(64)))
except (ConnectionResetError, BrokenPipeError):
    print("answer 0")
"""


async def test_relayed_commands_run_in_the_relays_container_and_only_the_agent_may_ask_it(relayed) -> None:
    """--relay: every command starts through a spawner the relay started (the relay's child, not the agent's: in
    a pod, in the sandbox container's cgroup); /health says resources_separated; a command (another uid) that asks
    the relay for a process is refused; /kill_all still kills what commands leave."""
    sb, proc, relay, name, uid = relayed
    assert await sb.health() and sb.uid_separated and sb.resources_separated
    r = await sb.exec("id -u; echo $PPID")
    who, spawner = r.stdout.split()
    assert who == str(uid) and _ppid(int(spawner)) == relay.pid, (r, relay.pid, proc.pid)
    await sb.write_file("ask.py", ASK_RELAY)
    r = await sb.exec(["python3", "ask.py", name])
    assert r.stdout == "answer 0\n", r  # refused: the connection closed without an answer
    await sb.exec("(setsid sh -c 'while :; do sleep 0.05; done' &) ; echo started")
    assert await sb.kill_all() >= 1 and await sb.kill_all() == 0
    assert (await sb.exec("echo ok")).stdout == "ok\n" and proc.poll() is None and relay.poll() is None
    await sb.close()


async def test_a_dead_relay_is_a_failed_command_not_an_agent_error(relayed) -> None:
    """The sandbox container's main process gone (in a pod: killed by the commands' memory limit): each exec is the
    policy's failed command (a result with a reason), never a 500, and the agent keeps answering."""
    sb, proc, relay, name, uid = relayed
    assert (await sb.exec("echo first")).stdout == "first\n"
    relay.kill()
    relay.wait()
    await sb.kill_all()  # the spawner goes too: the next exec needs the relay
    r = await sb.exec("echo second")
    assert r.exit_code == 126 and "relay" in r.stderr and r.stdout == "", r
    assert await sb.health() and proc.poll() is None
    await sb.close()


FAKE_RELAY = """
import os, socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\\0" + sys.argv[1])
srv.listen(4)
print("bound", flush=True)
while True:
    conn, _ = srv.accept()
    conn.recv(1 << 20)
    a, b = socket.socketpair()
    conn.sendmsg([os.getpid().to_bytes(8, "little")], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                         a.fileno().to_bytes(4, sys.byteorder))])
    b.sendall(b"R")
    conn.close()
"""


async def test_a_relay_of_another_uid_is_never_trusted(relayed) -> None:
    """A process of another uid (in a pod: a command, after the relay died) that binds the relay's name and answers
    like a relay does not get to start the agent's commands: the exec fails as the policy's, nothing runs."""
    sb, proc, relay, name, uid = relayed
    relay.kill()
    relay.wait()
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")  # one the other uid may run
    if python is None:
        pytest.skip("no system python3 for a process of another uid")
    fake = subprocess.Popen([python, "-I", "-S", "-c", FAKE_RELAY, name], user=uid, group=uid,
                            stdout=subprocess.PIPE)
    try:
        assert fake.stdout.readline() == b"bound\n"
        r = await sb.exec("echo should-not-run")
        assert r.exit_code == 126 and "another uid" in r.stderr and r.stdout == "", r
    finally:
        fake.kill()
        fake.wait()
        await sb.close()


NO_FORK_KILL = """
import json, os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from agent import handlers, identity as ids
uid = int(sys.argv[2])
identity = ids.Identity((uid, uid))
libc = ids.prctl_setup()
identity.setup(libc, sys.argv[3])
a = handlers.Agent(sys.argv[3], identity, libc=libc)
def no_fork(*args):
    raise OSError(11, "fork refused (the pids limit is full)")
handlers.fork_kill_all_as = no_fork
victims = [subprocess.Popen(["sleep", "60"], user=uid, group=uid, start_new_session=True) for _ in range(3)]
root = subprocess.Popen(["sleep", "60"])  # another uid's process: never touched
killed = a._kill_leftovers()
time.sleep(0.2)
def running(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
print(json.dumps({"killed": killed, "victims": [running(v.pid) for v in victims], "root": running(root.pid),
                  "euid": os.geteuid()}))
root.kill()
"""


def test_kill_all_needs_no_fork(tmp_path: Path) -> None:
    """/kill_all signals every process of the command user from the agent's own thread (raw setresuid there
    alone), so it works when no process can be forked (a pod's pids limit, shared with the commands, is full), and
    leaves processes of other uids alone; the agent is uid 0 again afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    uid = 60000 + (os.getpid() + 11) % 5000
    ws = tmp_path / "ws"
    ws.mkdir()
    out = subprocess.run([sys.executable, "-I", "-c", NO_FORK_KILL, PKG_PARENT, str(uid), str(ws)],
                         capture_output=True, text=True, timeout=60)
    report = json.loads(out.stdout or "{}") if out.returncode == 0 else out.stderr
    assert isinstance(report, dict), report
    assert report["killed"] == 3 and report["victims"] == [False] * 3 and report["root"] is True, report
    assert report["euid"] == 0, report


NO_THREADS = """
import os, socket, sys, threading
sys.path.insert(0, sys.argv[1])
from agent import handlers, protocol, server
os.makedirs(sys.argv[2], exist_ok=True)
a = handlers.Agent(sys.argv[2])
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[3])
srv.listen(16)
acc = server.Acceptor(srv, a, None)
def refuse(self):
    raise RuntimeError("can't start new thread")
threading.Thread.start = refuse  # from now on no thread can start (a full pids limit)
print(protocol.READY_LINE, flush=True)
acc.serve_forever()
"""


async def test_connections_are_served_when_no_thread_can_start(tmp_path: Path) -> None:
    """Worker threads are started up front and kept: with no thread to be had (in a pod the agent shares the pids
    limit with the commands), new connections, more at once than kept workers, are still served (the extra ones as
    soon as a kept worker is free), not refused."""
    sock = tmp_path / "a.sock"
    proc = subprocess.Popen([sys.executable, "-I", "-c", NO_THREADS, PKG_PARENT, str(tmp_path / "ws"),
                             str(sock)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().decode().strip() == protocol.READY_LINE
        boxes = [_sandbox(sock) for _ in range(server.PARKED_WORKERS + 2)]
        results = await asyncio.gather(*(b.exec(f"sleep 0.2; echo {i}") for i, b in enumerate(boxes)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(len(boxes))], results
        for b in boxes:
            await b.close()
        for _ in range(3):  # connections closed and opened again: the same threads serve them
            fresh = _sandbox(sock)
            assert (await fresh.exec("echo again")).stdout == "again\n"
            await fresh.close()
    finally:
        proc.kill()
        proc.wait()


async def test_the_agent_is_ready_only_once_the_relay_answers(tmp_path: Path) -> None:
    """In a pod the commands' container (0.05 CPU: a slow python start) may come up after the agent's: the agent
    waits for the relay before it listens (the pod's readiness), so the first command never meets a missing relay
    (that would be charged to the policy as a failed command)."""
    base, uid, name, env = _relay_layout("relay-late", 13)
    agent = subprocess.Popen([sys.executable, "-I", "-S", AGENT, "--unix", str(base / "a.sock"), "--workspace",
                              str(base / "ws"), "--run-as", f"{uid}:{uid}", "--relay", name],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    relay = None
    try:
        await asyncio.sleep(1.0)
        assert not (base / "a.sock").exists() and agent.poll() is None, "listening before the relay answered"
        relay = subprocess.Popen([sys.executable, "-I", "-S", "-c", agent_artifact.relay_source(), name], env=env)
        line = await asyncio.to_thread(agent.stdout.readline)
        assert line.decode().strip() == protocol.READY_LINE
        sb = _sandbox(base / "a.sock")
        assert (await sb.exec("echo first")).stdout == "first\n"
        await sb.close()
    finally:
        for p in (agent, relay):
            if p is not None:
                p.kill()
                p.wait()
        subprocess.run(["pkill", "-9", "-U", str(uid)], check=False)
        subprocess.run(["rm", "-rf", str(base)], check=False)
