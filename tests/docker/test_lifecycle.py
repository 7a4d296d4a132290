"""Lifecycle of docker sandboxes through the pool: state within a lease, a clean sandbox per lease, a container
killed from outside, dockerd restarting, the TTL, and the sweep of containers whose owner died."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docker
import pytest
from dockertier import IMAGE, RUN_ID, containers_owned_by, restart_dockerd, restart_problem

from agentrl.errors import SandboxDiedError
from agentrl.sandbox import Sandbox, SandboxPool, SandboxSpec

pytestmark = pytest.mark.docker

SPEC = SandboxSpec(image=IMAGE, default_timeout_s=20)
FIND_SLEEP = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -o 'slee[p] 300' | wc -l"
BACKGROUND = "setsid sh -c 'echo $$ > bg.pid; exec sleep 300' > /dev/null 2>&1 < /dev/null &"


def _pool(**kw: object) -> SandboxPool:
    return SandboxPool(backend="docker", spec=kw.pop("spec", SPEC), warm=kw.pop("warm", 1),
                       max_sandboxes=kw.pop("max_sandboxes", 2), run_id=RUN_ID, **kw)


def _container_state(name: str) -> str | None:
    client = docker.from_env()
    try:
        return client.api.inspect_container(name)["State"]["Status"]
    except docker.errors.NotFound:
        return None
    finally:
        client.close()


async def test_state_persists_across_calls_within_a_lease() -> None:
    async with _pool() as pool, pool.lease() as sb:
        await sb.write_file("pkg/solution.py", "def f():\n    return 41\n")
        r = await sb.exec("cd pkg && python3 -c 'import solution; print(solution.f() + 1)' > out.txt")
        assert r.exit_code == 0, r
        assert await sb.read_file("pkg/out.txt") == "42\n"
        await sb.exec(BACKGROUND)
        alive = await sb.exec("for i in $(seq 50); do [ -s bg.pid ] && break; sleep 0.1; done; kill -0 $(cat bg.pid)")
        assert alive.exit_code == 0, alive  # a background process outlives the exec that started it
        assert (await sb.exec("echo more >> pkg/out.txt; cat pkg/out.txt")).stdout == "42\nmore\n"


async def test_each_lease_starts_clean() -> None:
    async with _pool(warm=2) as pool:
        async with pool.lease() as first:
            await _dirty(first)
            first_id = first.id
        async with pool.lease() as second:
            assert second.id != first_id
            r = await second.exec("ls -A /workspace /tmp; " + FIND_SLEEP)
            assert r.stdout.split() == ["/tmp:", "/workspace:", "0"], r.stdout  # no files, no process
        assert await asyncio.to_thread(_container_state, first_id) is None  # destroyed, never reused


async def _dirty(sb: Sandbox) -> None:
    await sb.write_file("marker", "x")
    r = await sb.exec("echo y > /tmp/marker; " + BACKGROUND)
    assert r.exit_code == 0
    r = await sb.exec("for i in $(seq 50); do [ -s bg.pid ] && break; sleep 0.1; done; " + FIND_SLEEP)
    assert r.stdout.strip() == "1", r  # the dirt is really there before the next lease looks for it


async def test_container_killed_mid_trajectory_raises_sandbox_died_and_the_pool_goes_on() -> None:
    async with _pool(warm=1) as pool:
        with pytest.raises(SandboxDiedError):
            async with pool.lease() as sb:
                running = asyncio.create_task(sb.exec("sleep 30", timeout=60))
                await asyncio.sleep(0.5)
                await asyncio.to_thread(subprocess.run, ["docker", "kill", sb.id], check=True, capture_output=True)
                async with asyncio.timeout(15):  # an error, not a hang until the exec's own deadline
                    await running
        assert await asyncio.to_thread(_container_state, sb.id) is None  # the lease removed the dead container
        async with pool.lease() as again:
            assert (await again.exec("echo ok")).stdout == "ok\n"


async def test_a_container_stopped_during_a_command_is_an_outside_cause() -> None:
    """`docker stop` (SIGTERM; what dockerd does to every container when it shuts down for a restart, while it still
    answers inspect) during the policy's command: the agent exits 0 on SIGTERM, which no command can send it, so the
    cause is `killed:15` and the episode infra, not `exited:0` charged to the policy (found by the chaos soak)."""
    from agentrl.runner.attribution import DeathFacts, Stage, classify

    async with _pool(warm=0) as pool:
        with pytest.raises(SandboxDiedError) as died:
            async with pool.lease() as sb:
                running = asyncio.create_task(sb.exec("sleep 30", timeout=60))
                await asyncio.sleep(0.5)
                await asyncio.to_thread(subprocess.run, ["docker", "stop", sb.id], check=True, capture_output=True)
                try:
                    async with asyncio.timeout(15):
                        await running
                finally:
                    cause = await pool.death_cause(sb)
    assert cause == "killed:15", cause
    verdict = classify(died.value, Stage.turns, death=DeathFacts(in_flight=True, uid_separated=True, cause=cause))
    assert verdict.infra and verdict.kind == "sandbox_lost:killed:15", verdict


async def test_pool_recovers_after_dockerd_restarts() -> None:
    problem = restart_problem()
    if problem:
        pytest.skip(problem)
    async with _pool(warm=2, max_sandboxes=3) as pool:
        async with pool.lease() as sb:
            assert (await sb.exec("echo before")).stdout == "before\n"
        await pool.fill(timeout_s=120)  # the warm set is there when the daemon goes (under load it may still start)
        await asyncio.to_thread(restart_dockerd)
        for _ in range(3):  # warm sandboxes died with the daemon: each lease must still get a working one
            async with pool.lease() as sb:
                r = await sb.exec("echo after")
                assert r.exit_code == 0 and r.stdout == "after\n", r
        assert pool.stats()["replaced"] >= 1


class EngineProxy:
    """The machine's Docker Engine behind a unix socket of this test's own, which the test takes away (socket gone,
    open connections closed: what a client sees while dockerd restarts) and brings back. dockerd is never touched."""

    def __init__(self, path: Path) -> None:
        self.path, self.host = path, f"unix://{path}"
        self.engine = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        self._server = await asyncio.start_unix_server(self._pipe, path=str(self.path))

    async def down(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._open):
            w.close()
        self.path.unlink(missing_ok=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_unix_connection(self.engine)
        self._open |= {writer, up_w}

        async def copy(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()
                self._open.discard(w)

        await asyncio.gather(copy(reader, up_w), copy(up_r, writer))


async def test_a_lease_waits_for_an_engine_that_is_away(tmp_path: Path) -> None:
    """dockerd does not answer (restarting) when a lease must start a sandbox: the pool waits for the engine and the
    lease gets a working sandbox once it is back. Before, the start's attempts failed within milliseconds, so a
    trajectory used up its infra retries during one restart and ended unscored (found by the chaos soak)."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    await proxy.up()
    try:
        async with _pool(warm=0, backend_options={"docker_host": proxy.host}) as pool:
            await proxy.down()
            back = asyncio.get_running_loop().call_later(3.0, lambda: asyncio.ensure_future(proxy.up()))
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(120), pool.lease() as sb:
                    assert (await sb.exec("echo back")).stdout == "back\n"
            finally:
                back.cancel()
            assert time.monotonic() - t0 >= 2.5  # it waited for the engine
            assert pool.stats()["failures"] >= 1  # and did try while it was away
    finally:
        await proxy.down()


async def test_dockerd_restart_during_the_policys_command_is_infra_not_the_policys(smollm2_tokenizer) -> None:
    """Through the real runner (code_tests, a scripted model): dockerd restarts while the policy's command runs, which
    kills the container mid-request. The engine's socket refusing connections is the proof of an outside cause
    (nothing in a container reaches it), so the episode is infra_error `sandbox_lost:engine_lost`, unscored, never a
    0 charged to the policy; the next episode runs once the engine is back."""
    problem = restart_problem()
    if problem:
        pytest.skip(problem)
    from agentrl.envs import get_env
    from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
    from agentrl.testing.scripted import ScriptedEngine
    from agentrl.tools.render import ChatRenderer
    from agentrl.types import SamplingParams, Status

    env = get_env("code_tests", source="easy")
    task = next(iter(env.tasks()))
    loop = asyncio.get_running_loop()
    restarts: list[asyncio.Future] = []

    def reply(session: str, turn: int, _ids: list[int]) -> str:
        if not restarts:  # the first episode's first turn: the engine goes away 1.5 s into its command
            restarts.append(loop.run_in_executor(None, lambda: (time.sleep(1.5), restart_dockerd())))
            return "```python\nimport time\ntime.sleep(30)\n```"
        return f"```python\ndef {task.data['entry_point']}(*args):\n    return object()\n```"

    tok = smollm2_tokenizer
    rollout = Rollout(env=env, engine=ScriptedEngine(tok, reply), renderer=ChatRenderer(tok),
                      sampling=SamplingParams(max_new_tokens=256, stop_token_ids=[tok.eos_token_id]),
                      budgets=Budgets(max_turns=1, max_completion_tokens=1024, context_window=8192,
                                      tool_timeout_s=60))
    async with _pool(warm=0, spec=SandboxSpec(image=IMAGE, default_timeout_s=60)) as pool:
        scheduler = Scheduler(rollout, pool, SchedulerConfig(group_size=1, infra_retries=0))
        lost = await scheduler.run_one(task, group_id="g", sample_index=0)
        await restarts[0]
        assert lost.status is Status.infra_error, (lost.status, lost.error_kind, lost.error)
        assert lost.error_kind == "sandbox_lost:engine_lost" and lost.reward is None, (lost.error_kind, lost.reward)
        after = await scheduler.run_one(task, group_id="g2", sample_index=0)
    assert after.status is not Status.infra_error and after.reward == 0.0, (after.status, after.error_kind)


async def test_ttl_stops_the_container_and_sweep_removes_it(backend) -> None:
    spec = SandboxSpec(image=IMAGE, ttl_s=10)
    handle = await backend.create(spec, {"agentrl.run_id": RUN_ID})
    try:
        assert await backend.alive(handle)
        assert await backend.sweep() == 0  # owner alive, TTL not reached: nothing to do
        deadline = time.monotonic() + 30
        while await backend.alive(handle):  # the agent's alarm fires at ttl_s even though nobody sweeps
            assert time.monotonic() < deadline, "container still running 30 s after a 10 s TTL"
            await asyncio.sleep(0.5)
        assert await backend.sweep() >= 1
        assert await asyncio.to_thread(_container_state, handle.id) is None
    finally:
        await backend.destroy(handle)


OWNER_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from agentrl.sandbox import Sandbox, SandboxPool, SandboxSpec

    async def main():
        async with SandboxPool(backend="docker", spec=SandboxSpec(image=sys.argv[1]), warm=2, max_sandboxes=2,
                               run_id="doomed-owner") as pool:
            while pool.stats()["warm_ready"] < 2:
                await asyncio.sleep(0.05)
            print("READY", flush=True)
            await asyncio.sleep(600)

    asyncio.run(main())
""")


def _start_owner() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT, IMAGE], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", f"owner process did not get ready (rc={proc.poll()})"
    return proc


@pytest.mark.parametrize("remover", ["next-pool-start", "sandbox-gc"])
async def test_containers_of_a_killed_owner_are_removed(remover: str) -> None:
    proc = await asyncio.to_thread(_start_owner)
    os.kill(proc.pid, signal.SIGKILL)
    await asyncio.to_thread(proc.wait)
    left = await asyncio.to_thread(containers_owned_by, proc.pid)
    assert len(left) == 2  # kill -9: nothing ran its cleanup
    if remover == "next-pool-start":
        async with _pool(warm=0):
            pass
    else:
        r = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentrl.cli", "sandbox", "gc",
                                                     "--backend", "docker"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "removed" in r.stdout
    assert await asyncio.to_thread(containers_owned_by, proc.pid) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_rollout_removes_its_containers_within_10s(sig: signal.Signals, eos_prone_model, tmp_path) -> None:
    cmd = [sys.executable, "-m", "agentrl.cli", "rollout", "--sandbox", "docker", "--engine", "local",
           "--env", "code_tests", "--model", str(eos_prone_model), "--tasks", "8", "--group-size", "2",
           "--max-turns", "4", "--max-new-tokens", "64", "--concurrency", "4", "--out", str(tmp_path / "t.jsonl")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len(containers_owned_by(proc.pid)) < 2:
            assert proc.poll() is None, f"rollout ended before it could be interrupted: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "rollout never started its docker sandboxes"
            time.sleep(0.1)
        proc.send_signal(sig)
        sent = time.monotonic()
        while (left := containers_owned_by(proc.pid)) and time.monotonic() - sent < 10:
            time.sleep(0.1)
        assert left == [], f"containers left 10 s after {sig.name} (rc={proc.poll()}): {left}"
        print(f"{sig.name}: no container left after {time.monotonic() - sent:.2f}s")
        assert proc.wait(timeout=30) == 130, proc.stderr.read()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        subprocess.run(["docker", "rm", "-f", *containers_owned_by(proc.pid)], capture_output=True, check=False)
