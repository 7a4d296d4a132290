"""The local backend and the pool for real: bubblewrap sandboxes, cgroups or rlimits, the agent, leases.

Skips (with the reason) only when bubblewrap is not installed or may not create namespaces here (set
AGENTRL_REQUIRE_BWRAP=1 to fail instead); the missing-bwrap and unsafe-mode tests run anyway.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.errors import ConfigError, MissingDependencyError, SandboxDiedError
from agentrl.sandbox import SandboxPathError, SandboxPool, SandboxSpec, make_backend
from agentrl.sandbox.local import LocalBackend, process_start


def _bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate here (not installed / namespaces not permitted), or None when it can.
    AGENTRL_REQUIRE_BWRAP=1 turns the resulting skips into failures."""
    if shutil.which("bwrap") is None:
        return "bubblewrap not installed (apt-get install -y bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/",
                            "--", "/bin/true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()}"
    return None


_PROBLEM = _bwrap_problem()
if _PROBLEM and os.environ.get("AGENTRL_REQUIRE_BWRAP") == "1":
    raise RuntimeError(f"AGENTRL_REQUIRE_BWRAP=1 but {_PROBLEM}")
needs_bwrap = pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")

SPEC = SandboxSpec(memory="256m", pids=128, disk="64m", default_timeout_s=20)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # short path: the agent's unix socket lives below it (sun_path is limited to 108 bytes)
    path = Path(tempfile.mkdtemp(prefix="agrl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def pool(state_dir: Path) -> AsyncIterator[SandboxPool]:
    async with SandboxPool("local", SPEC, warm=0, max_sandboxes=4, state_dir=state_dir) as p:
        yield p


def _state(state_dir: Path, sid: str) -> dict:
    return json.loads((state_dir / sid / "state.json").read_text())


def _sandbox_dirs(state_dir: Path) -> list[Path]:
    """What the state root holds of sandboxes (not the backend's shared interpreter copy, `judge-python`)."""
    return [p for p in state_dir.iterdir() if p.name != "judge-python"]


def _alive(pid: int | None, start: int | None) -> bool:
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and process_start(pid) == start


def _leftovers(states: list[dict]) -> list[str]:
    """Processes, cgroups and directories of these sandboxes that still exist."""
    out = [f"pid {s['pid']}" for s in states if _alive(s["pid"], s["pid_start"])]
    out += [cg for s in states for cg in s["cgroups"] if os.path.exists(cg)]
    return out


async def _until_unreachable(sock_path: Path, limit_s: float = 10.0) -> None:
    """Wait until nothing accepts connections on `sock_path` (a killed sandbox's pid namespace is torn down
    asynchronously by the kernel)."""
    async with asyncio.timeout(limit_s):
        while True:
            try:
                _, writer = await asyncio.open_unix_connection(str(sock_path))
            except OSError:
                return
            writer.close()
            await asyncio.sleep(0.02)


# ---------------------------------------------------------------- isolation


@needs_bwrap
async def test_state_persists_within_a_lease_and_each_lease_starts_clean(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        await sb.write_file("notes.txt", "one")
        await sb.exec("echo two >> notes.txt; echo tmp > /tmp/t; mkdir -p pkg && touch pkg/__init__.py")
        r = await sb.exec("cat notes.txt /tmp/t; ls pkg")
        assert r.stdout == "onetwo\ntmp\n__init__.py\n"
        assert await sb.read_file("notes.txt") == "onetwo\n"
        first = sb.id
    async with pool.lease() as sb:
        assert sb.id != first
        r = await sb.exec("ls -A /workspace /tmp")
        assert r.stdout.split() == ["/tmp:", "/workspace:"]


@needs_bwrap
async def test_runs_as_non_root_with_private_pid_namespace(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        r = await sb.exec("id -u; id -g; echo $HOME; ls /proc | grep -c '^[0-9]'")
        uid, gid, home, nprocs = r.stdout.split()
        assert (uid, gid, home) == ("1000", "1000", "/workspace")
        assert int(nprocs) < 10  # bwrap's init, the agent, this shell and its pipeline: no host processes


@needs_bwrap
async def test_no_network(pool: SandboxPool) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    probe = textwrap.dedent(f"""
        import socket
        for addr in [("1.1.1.1", 53), ("127.0.0.1", {port})]:
            s = socket.socket(); s.settimeout(2)
            try:
                s.connect(addr); print("connected", addr)
            except OSError as e:
                print("refused", addr[1], type(e).__name__)
    """)
    try:
        async with pool.lease() as sb:
            r = await sb.exec(["python3", "-c", probe])
    finally:
        server.close()
    assert r.exit_code == 0, r.stderr
    assert "connected" not in r.stdout and r.stdout.count("refused") == 2


@needs_bwrap
async def test_host_files_are_invisible(pool: SandboxPool, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("secret")
    home_dir = Path(tempfile.mkdtemp(prefix="agrl-home-", dir=os.path.expanduser("~")))
    (home_dir / "k").write_text("key")
    try:
        async with pool.lease() as sb:
            for path in (secret, home_dir / "k", Path("/root"), Path("/home"), Path("/work"), Path.cwd()):
                r = await sb.exec(["ls", str(path)])
                assert r.exit_code != 0, f"{path} is visible inside the sandbox: {r.stdout}"
            shadow = await sb.exec("cat /etc/shadow")
            assert shadow.exit_code != 0
    finally:
        shutil.rmtree(home_dir)


@needs_bwrap
async def test_writes_outside_workspace_are_refused(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        with pytest.raises(SandboxPathError):
            await sb.write_file("/etc/evil", "x")
        with pytest.raises(SandboxPathError):
            await sb.write_file("../../usr/evil", "x")
        for cmd in ("touch /usr/evil", "echo x >> /etc/hosts", "mkdir /evil", "touch /bin/evil"):
            r = await sb.exec(cmd)
            assert r.exit_code != 0, f"{cmd!r} succeeded"
        assert not os.path.exists("/usr/evil") and not os.path.exists("/evil")


# ---------------------------------------------------------------- limits


@needs_bwrap
async def test_timeout_kills_process_tree_that_ignores_sigterm(pool: SandboxPool) -> None:
    script = ("trap '' TERM; (trap '' TERM; sleep 1; echo late > late1) & "
              "sh -c 'trap \"\" TERM; (sleep 1; echo late > late2) & sleep 1; echo late > late3' & "
              "echo started; sleep 60")
    async with pool.lease() as sb:
        r = await sb.exec(script, timeout=0.5)
        assert r.timed_out and r.exit_code is None and r.stdout == "started\n"
        await asyncio.sleep(1.5)
        listing = await sb.exec("ls -A; echo sleeps=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -c sleep)")
        assert listing.stdout == "sleeps=0\n"  # no file appeared, no sleep left


@needs_bwrap
async def test_huge_output_is_capped(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        r = await sb.exec("head -c 100000000 /dev/zero | tr '\\0' x", timeout=60)
        assert r.exit_code == 0 and r.truncated and not r.timed_out
        assert len(r.stdout) == SPEC.output_limit


@needs_bwrap
async def test_fork_bomb_is_contained(state_dir: Path) -> None:
    backend = LocalBackend(state_dir=state_dir)
    if not backend.enforces_pids:
        pytest.skip(f"limits mode {backend.limits_mode!r} cannot enforce a pids limit for host uid 0")
    spec = SandboxSpec(pids=64, memory="256m", default_timeout_s=20)
    async with SandboxPool(backend, spec, max_sandboxes=1) as pool:
        async with pool.lease() as sb:
            r = await sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=3)
            assert "fork" in r.stderr.lower()  # the shell hit the pids limit ("Cannot fork" / "fork: ...")
            after = await sb.exec("echo still usable")
            assert after.stdout == "still usable\n"
    await backend.close()


@needs_bwrap
async def test_memory_hog_is_killed_and_sandbox_survives(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        r = await sb.exec(["python3", "-c", "b = b'x' * (1024 * 1024 * 1024); print('allocated', len(b))"])
        assert r.exit_code != 0 and "allocated" not in r.stdout
        assert await sb.health()
        assert (await sb.exec("echo ok")).stdout == "ok\n"


@needs_bwrap
async def test_workspace_disk_is_limited(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        r = await sb.exec("head -c 100000000 /dev/zero > big")
        assert r.exit_code != 0
        size = int((await sb.exec("stat -c %s big")).stdout)
        assert size <= SPEC.disk_bytes


@needs_bwrap
async def test_background_process_does_not_hang_exec(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        r = await sb.exec("sleep 60 & echo bg", timeout=30)
        assert r.stdout == "bg\n" and not r.timed_out and r.duration_s < 10


# ---------------------------------------------------------------- lifecycle and leaks


@needs_bwrap
async def test_cancelled_lease_destroys_its_sandbox(pool: SandboxPool, state_dir: Path) -> None:
    entered = asyncio.Event()
    seen: list[str] = []

    async def trajectory() -> None:
        async with pool.lease() as sb:
            seen.append(sb.id)
            entered.set()
            await sb.exec("sleep 60")

    task = asyncio.create_task(trajectory())
    await entered.wait()
    state = _state(state_dir, seen[0])
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (state_dir / seen[0]).exists()
    assert _leftovers([state]) == []
    assert pool.stats()["active"] == 0


@needs_bwrap
@pytest.mark.parametrize("delay", [0.0, 0.005, 0.02, 0.06])
async def test_lease_cancelled_while_starting_leaves_nothing(state_dir: Path, delay: float) -> None:
    async with SandboxPool("local", SPEC, warm=0, state_dir=state_dir) as pool:
        async def trajectory() -> None:
            async with pool.lease() as sb:
                await sb.exec("sleep 60")

        task = asyncio.create_task(trajectory())
        await asyncio.sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _sandbox_dirs(state_dir) == []


@needs_bwrap
async def test_pool_exit_while_refilling_leaves_nothing(state_dir: Path) -> None:
    async with SandboxPool("local", SPEC, warm=3, max_sandboxes=4, state_dir=state_dir):
        await asyncio.sleep(0.02)  # refillers are mid-create
    assert _sandbox_dirs(state_dir) == []


@needs_bwrap
async def test_pool_exit_leaves_no_processes_or_dirs(state_dir: Path) -> None:
    states: list[dict] = []
    async with SandboxPool("local", SPEC, warm=2, max_sandboxes=4, state_dir=state_dir) as pool:
        await pool.fill(timeout_s=60)
        async with pool.lease() as sb:
            await sb.exec("sleep 100 > /dev/null 2>&1 &")
            states = [_state(state_dir, d.name) for d in _sandbox_dirs(state_dir)]
            assert len(states) >= 2
            stats = pool.stats()
            assert stats["warm_hits"] == 1 and stats["cold_starts"] == 0
    assert states and _leftovers(states) == []
    assert _sandbox_dirs(state_dir) == []


@needs_bwrap
async def test_pool_replaces_a_dead_warm_sandbox(state_dir: Path) -> None:
    async with SandboxPool("local", SPEC, warm=1, max_sandboxes=2, state_dir=state_dir) as pool:
        await pool.fill(timeout_s=60)
        (victim,) = [_state(state_dir, d.name) for d in _sandbox_dirs(state_dir)]
        os.killpg(victim["pid"], 9)
        await _until_unreachable(state_dir / victim["id"] / "run" / "agent.sock")
        async with pool.lease() as sb:
            assert sb.id != victim["id"]
            assert (await sb.exec("echo ok")).stdout == "ok\n"
        assert pool.stats()["replaced"] == 1


@needs_bwrap
async def test_leases_beyond_max_wait(state_dir: Path) -> None:
    async with SandboxPool("local", SPEC, warm=0, max_sandboxes=1, state_dir=state_dir) as pool:
        order: list[str] = []
        release = asyncio.Event()

        async def first() -> None:
            async with pool.lease():
                order.append("first-in")
                await release.wait()
                order.append("first-out")

        async def second() -> None:
            async with pool.lease():
                order.append("second-in")

        t1 = asyncio.create_task(first())
        while not order:
            await asyncio.sleep(0.01)
        t2 = asyncio.create_task(second())
        await asyncio.sleep(0.3)
        assert order == ["first-in"]
        release.set()
        await asyncio.gather(t1, t2)
        assert order == ["first-in", "first-out", "second-in"]


@needs_bwrap
async def test_destroyed_sandbox_raises_sandbox_died(state_dir: Path) -> None:
    backend = LocalBackend(state_dir=state_dir)
    async with SandboxPool(backend, SPEC) as pool:
        async with pool.lease() as sb:
            await backend.destroy(sb.handle)
            await backend.destroy(sb.handle)  # idempotent
            with pytest.raises(SandboxDiedError):
                await sb.exec("echo hi")
            assert not await backend.alive(sb.handle)
    await backend.close()


_DEAD_RUN = """
import asyncio, os, sys
from agentrl.sandbox.local import LocalBackend
from agentrl.sandbox.base import SandboxSpec
async def main():
    handle = await LocalBackend(state_dir=sys.argv[1]).create(SandboxSpec(), {"agentrl/run-id": "dead-run"})
    print(handle.id, flush=True)
    os.kill(os.getpid(), 9)
asyncio.run(main())
"""


@needs_bwrap
async def test_sweep_removes_sandboxes_of_a_dead_run_only(state_dir: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _DEAD_RUN, str(state_dir), env=env,
                                                stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    dead_id = out.decode().strip()
    assert proc.returncode == -9 and (state_dir / dead_id).is_dir()
    dead_state = _state(state_dir, dead_id)

    backend = LocalBackend(state_dir=state_dir)
    live = await backend.create(SPEC, {"agentrl/run-id": "live-run"})
    assert await backend.sweep() == 1
    assert not (state_dir / dead_id).exists() and _leftovers([dead_state]) == []
    assert await backend.alive(live)  # the live run's sandbox is untouched
    assert await backend.sweep(run_id="live-run") == 1
    assert not await backend.alive(live) and _sandbox_dirs(state_dir) == []
    await backend.close()


@needs_bwrap
async def test_sweep_removes_expired_sandboxes(state_dir: Path) -> None:
    backend = LocalBackend(state_dir=state_dir)
    handle = await backend.create(SandboxSpec(ttl_s=10), {})
    path = state_dir / handle.id / "state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "created_at": state["created_at"] - 11}))
    other = LocalBackend(state_dir=state_dir)  # another process's view: a foreign sandbox
    assert await other.sweep() == 1
    assert _leftovers([state]) == [] and not (state_dir / handle.id).exists()
    await backend.close()


# ---------------------------------------------------------------- configuration


@needs_bwrap
async def test_share_host_python_exposes_its_packages_read_only(state_dir: Path) -> None:
    opts = {"share_host_python": True}
    async with SandboxPool("local", SPEC, state_dir=state_dir, backend_options=opts) as pool:
        async with pool.lease() as sb:
            r = await sb.exec(["python", "-c", "import pytest, sys; print(sys.prefix)"])
            assert r.exit_code == 0 and r.stdout.strip() == os.path.realpath(sys.prefix), r.stderr
            assert (await sb.exec(f"touch {sys.prefix}/evil")).exit_code != 0


async def test_missing_bwrap_names_the_install_command(tmp_path: Path, state_dir: Path) -> None:
    with pytest.raises(MissingDependencyError, match="apt-get install -y bubblewrap"):
        LocalBackend(state_dir=state_dir, search_path=str(tmp_path))
    pool = SandboxPool("local", SPEC, state_dir=state_dir, backend_options={"search_path": str(tmp_path)})
    with pytest.raises(MissingDependencyError):
        async with pool:
            pass


async def test_unsafe_mode_runs_without_bwrap_and_warns(tmp_path: Path, state_dir: Path, caplog) -> None:
    caplog.set_level("WARNING", logger="agentrl.sandbox")
    backend = LocalBackend(state_dir=state_dir, search_path=str(tmp_path), unsafe_no_isolation=True)
    assert "PLAIN PROCESSES" in caplog.text
    async with SandboxPool(backend, SPEC) as pool:
        async with pool.lease() as sb:
            await sb.write_file("x.txt", "hi")
            r = await sb.exec("cat x.txt; pwd")
            assert r.stdout.startswith("hi") and str(state_dir) in r.stdout
    assert _sandbox_dirs(state_dir) == []
    await backend.close()


def test_unknown_backend_and_bad_options_are_config_errors(state_dir: Path) -> None:
    with pytest.raises(ConfigError, match="backend 'nope' is unknown"):
        make_backend("nope")
    with pytest.raises(ConfigError, match="limits_mode"):
        LocalBackend(state_dir=state_dir, limits_mode="cgroup3")
    with pytest.raises(ConfigError, match="too long"):
        LocalBackend(state_dir=state_dir / ("x" * 120))
    with pytest.raises(ConfigError, match="max_sandboxes"):
        SandboxPool("local", SPEC, max_sandboxes=0)


def test_writable_dirs_are_validated() -> None:
    assert SandboxSpec(writable_dirs=("/repo", "/data/x")).writable_dirs == ("/repo", "/data/x")
    for bad in (("repo",), ("/",), ("/repo/",), ("/tmp/x",), ("/workspace",), ("/usr/local/x",), ("/repo", "/repo"),
                ("/data", "/data/x"), ("/a:b",)):
        with pytest.raises(ValueError, match="writable_dirs"):
            SandboxSpec(writable_dirs=bad)


@needs_bwrap
async def test_writable_dir_outside_the_workspace(state_dir: Path) -> None:
    """A spec's writable dir (e.g. /repo) is an empty, size-limited directory of the sandbox user, usable by commands
    and the file API, fresh in every sandbox; the rest of the root stays read-only."""
    spec = SPEC.model_copy(update={"writable_dirs": ("/repo", "/data/deep")})
    async with SandboxPool("local", spec, warm=0, max_sandboxes=2, state_dir=state_dir) as p:
        async with p.lease() as sb:
            r = await sb.exec(["sh", "-c", "ls -A /repo; stat -c '%u %a' /repo /data/deep; id -u; "
                                           "export GIT_CONFIG_NOSYSTEM=1; git init -q /repo && git -C /repo status --short && echo git-ok; "
                                           "echo hi > /repo/a.txt; touch /elsewhere 2>&1 || echo ro-root"])
            lines = r.stdout.split("\n")
            uid = lines[2]
            assert lines[:2] == [f"{uid} 755", f"{uid} 755"] and "git-ok" in r.stdout and "ro-root" in r.stdout, r
            assert await sb.read_bytes("/repo/a.txt") == b"hi\n"
            await sb.write_file("/data/deep/b/c.txt", "x")
            assert (await sb.exec(["cat", "/data/deep/b/c.txt"])).stdout == "x"
            with pytest.raises(SandboxPathError):
                await sb.read_bytes("/etc/hostname")
            r = await sb.exec(["sh", "-c", "head -c 70000000 /dev/zero > /repo/big 2>&1; echo rc=$?"])
            assert "rc=0" not in r.stdout, "the writable dir is size-limited (spec.disk)"
            r = await sb.exec(["sh", "-c", "cd /repo && pwd -P"])
            assert r.stdout.strip() == "/repo"
        async with p.lease() as sb:
            assert (await sb.exec(["ls", "-A", "/repo"])).stdout == "", "every sandbox gets its own, empty"
