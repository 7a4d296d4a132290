"""Failures the kubernetes backend must survive, scripted on the fake API edge: throttling and server errors on
create (back-off, Retry-After, no duplicate pod when an answer is lost), killed workers (sweep by owner pod, by
owner process, garbage collection by owner reference), TTLs (activeDeadlineSeconds, warm-pool recycling), broken
and expired watches, and a pod deleted in the middle of a trajectory (infra_error, then a retry that succeeds; this
one also on a real cluster)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from typing import Any

import pytest

from agentrl.errors import SandboxDiedError, SandboxStartError
from agentrl.sandbox import Sandbox
from agentrl.sandbox.kubernetes.pods import Owner, is_ready

pytestmark = pytest.mark.timeout(120)


async def test_create_backs_off_on_429_honouring_retry_after(fake_cluster: Any) -> None:
    fake = fake_cluster.fake
    backend = fake_cluster.backend()
    await backend.sweep()  # start-up done: only the create is measured
    fake.inject("create", "pods", 429, times=2, retry_after=1)
    t0 = time.monotonic()
    handle = await backend.create(fake_cluster.spec, {})
    assert time.monotonic() - t0 >= 2.0, "two 'Retry-After: 1' answers were not waited out"
    assert backend.plane.counters["api_retries"] == 2
    assert fake.calls["create pods"] == 3 and len(await fake_cluster.pods()) == 1
    await backend.destroy(handle)


async def test_create_gives_up_after_api_attempts_without_leaking(fake_cluster: Any) -> None:
    fake = fake_cluster.fake
    backend = fake_cluster.backend(api_attempts=3, backoff_base_s=0.01)
    await backend.sweep()
    fake.inject("create", "pods", 503, times=10)
    with pytest.raises(SandboxStartError, match="503"):
        await backend.create(fake_cluster.spec, {})
    assert fake.calls["create pods"] == 3
    assert await fake_cluster.pods() == []


async def test_lost_create_answer_does_not_duplicate_the_pod(fake_cluster: Any) -> None:
    fake = fake_cluster.fake
    backend = fake_cluster.backend(backoff_base_s=0.01)
    await backend.sweep()
    fake.inject("create", "pods", 500, after=True)  # the pod is created, the answer is lost
    handle = await backend.create(fake_cluster.spec, {})
    assert fake.calls["create pods"] == 2 and [p["metadata"]["name"] for p in await fake_cluster.pods()] == [handle.id]
    sb = Sandbox(handle, fake_cluster.spec)
    assert (await sb.exec("echo ok")).stdout == "ok\n"
    await sb.close()
    await backend.destroy(handle)


async def test_refill_under_throttling_still_fills_the_pool(fake_cluster: Any) -> None:
    fake_cluster.fake.inject("create", "pods", 429, times=6)
    backend = fake_cluster.backend(warm=4, max_pending=2)
    await backend.warm_up(fake_cluster.spec)
    async with asyncio.timeout(60):
        while sum(1 for p in await fake_cluster.pods("agentrl.io/state=warm") if is_ready(p)) < 4:
            await asyncio.sleep(0.05)
    assert backend.plane.counters["api_retries"] == 6
    assert len(await fake_cluster.pods()) == 4, "no more than `warm` pods were created"


async def _worker_pod(cluster: Any, name: str) -> Owner:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "rollout"}},
            "spec": {"containers": [{"name": "main", "image": "agentrl:latest", "command": ["agentrl"]}]}}
    pod = await cluster.kube.request("POST", cluster.path(), body=body)
    return Owner(session=f"s-{name}", host=name, pid=1, pid_start="1", pod_name=name, pod_namespace="agentrl",
                 pod_uid=pod["metadata"]["uid"])


async def test_sandboxes_of_a_killed_worker_are_swept(fake_cluster: Any) -> None:
    fake = fake_cluster.fake
    alive = fake_cluster.backend(owner=await _worker_pod(fake_cluster, "rollout-0"))
    doomed = fake_cluster.backend(owner=await _worker_pod(fake_cluster, "rollout-1"))
    kept = await alive.create(fake_cluster.spec, {})
    lost = [await doomed.create(fake_cluster.spec, {}) for _ in range(3)]
    pods = {p["metadata"]["name"]: p for p in await fake_cluster.pods()}
    assert pods[lost[0].id]["metadata"]["ownerReferences"][0]["uid"] == doomed.owner.pod_uid
    # the worker dies without cleaning up, and the garbage collector has not acted (or could not)
    fake_cluster.backends.remove(doomed)
    await doomed.plane.informer.stop()
    await doomed.api.close()
    fake.gc = False
    await fake_cluster.delete_pod("rollout-1")
    sweeper = fake_cluster.backend()
    assert await sweeper.sweep() == 3
    left = {p["metadata"]["name"] for p in await fake_cluster.pods() if not p["metadata"].get("deletionTimestamp")}
    assert left == {kept.id}
    # with the garbage collector on, deleting a worker's pod deletes its sandboxes by owner reference
    fake.gc = True
    other = fake_cluster.backend(owner=await _worker_pod(fake_cluster, "rollout-2"))
    orphan = await other.create(fake_cluster.spec, {})
    await fake_cluster.delete_pod("rollout-2")
    async with asyncio.timeout(10):
        while orphan.id in {p["metadata"]["name"] for p in await fake_cluster.pods()}:
            await asyncio.sleep(0.05)
    await alive.destroy(kept)


async def test_sandboxes_of_a_dead_local_process_are_swept(fake_cluster: Any) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = Owner(session="s-dead", host=socket.gethostname(), pid=proc.pid, pid_start="0")
    worker = fake_cluster.backend(owner=dead)
    await worker.create(fake_cluster.spec, {"agentrl/run-id": "old"})
    sweeper = fake_cluster.backend()
    assert await sweeper.sweep() == 1
    worker.plane._live.clear()  # already swept: nothing left for close()


async def test_ttl_kills_the_pod_and_the_sweep_removes_it(fake_cluster: Any) -> None:
    backend = fake_cluster.backend()
    spec = fake_cluster.spec.model_copy(update={"ttl_s": 60})
    handle = await backend.create(spec, {})
    sb = Sandbox(handle, spec)
    assert (await sb.exec("echo fresh")).exit_code == 0
    fake_cluster.kubelet.age("agentrl", handle.id, 120)  # now past activeDeadlineSeconds
    async with asyncio.timeout(10):
        while await backend.alive(handle):
            await asyncio.sleep(0.05)
    with pytest.raises(SandboxDiedError):
        await sb.exec("echo late")
    await sb.close()
    pod = (await fake_cluster.pods())[0]
    assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "DeadlineExceeded"
    assert await fake_cluster.backend().sweep() == 1


async def test_idle_warm_pods_are_recycled_and_never_claimed(fake_cluster: Any) -> None:
    backend = fake_cluster.backend(warm=2, warm_max_idle_s=60)
    await backend.warm_up(fake_cluster.spec)
    async with asyncio.timeout(30):
        while sum(1 for p in await fake_cluster.pods("agentrl.io/state=warm") if is_ready(p)) < 2:
            await asyncio.sleep(0.05)
    old = {p["metadata"]["name"] for p in await fake_cluster.pods()}
    for name in old:
        fake_cluster.kubelet.age("agentrl", name, 3600)
    async with asyncio.timeout(30):
        while backend.plane.counters["recycled"] < 2:
            await asyncio.sleep(0.05)
    handle = await backend.create(fake_cluster.spec, {})
    assert handle.id not in old
    await backend.destroy(handle)


async def test_watch_survives_drops_and_expiry(fake_cluster: Any) -> None:
    fake = fake_cluster.fake
    backend = fake_cluster.backend()
    first = await backend.create(fake_cluster.spec, {})
    fake.drop_watches()  # reconnect from the last resourceVersion
    second = await backend.create(fake_cluster.spec, {})
    fake.create_object("configmaps", "agentrl", {"metadata": {"name": "unrelated"}, "data": {}})
    fake.compact()  # history up to the configmap's write is gone
    fake.drop_watches()  # the informer's resourceVersion is now too old: 410, relist
    third = await backend.create(fake_cluster.spec, {})
    assert backend.api.calls["list pods"] >= 2 and backend.api.calls["get pods"] == 0
    for h in (first, second, third):
        assert await backend.alive(h)
        await backend.destroy(h)


async def _episode_with_a_fault(cluster: Any, backend: Any, tok: Any, fault: Any, run_id: str) -> tuple[Any, list]:
    """One code_tests episode answered right, through the real runner with infra_retries=1; while the model
    "thinks" on its first turn, `await fault(pod name)` hits the claimed pod. Returns (trajectory, what it gave)."""
    from agentrl.envs import get_env
    from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
    from agentrl.sandbox import SandboxPool
    from agentrl.testing.scripted import ScriptedEngine
    from agentrl.tools.render import ChatRenderer
    from agentrl.types import SamplingParams

    env = get_env("code_tests", source="easy")
    task = next(iter(env.tasks()))
    reply = f"Here is my solution.\n```python\n{env.reference_solution(task)}\n```"
    inner = ScriptedEngine(tok, [reply, "Done."])
    faults: list[Any] = []

    class FaultOnFirstTurn:
        def __getattr__(self, item: str) -> Any:
            return getattr(inner, item)

        async def generate(self, input_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Any:
            if not faults:
                pod = (await cluster.pods("agentrl.io/state=claimed"))[0]["metadata"]["name"]
                faults.append(await fault(pod))
            return await inner.generate(input_ids, sampling, session_id=session_id)

    spec = env.sandbox_spec.model_copy(update={"cpus": 0.2, "memory": "256m"})  # fits a 2-core dev node twice
    rollout = Rollout(env=env, engine=FaultOnFirstTurn(), renderer=ChatRenderer(tok),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=256, stop_token_ids=[tok.eos_token_id]),
                      budgets=Budgets(max_turns=3, max_completion_tokens=2048, context_window=4096))
    async with SandboxPool(backend, spec, max_sandboxes=2, run_id=run_id) as pool:
        sched = Scheduler(rollout, pool, SchedulerConfig(group_size=1, infra_retries=1))
        return await sched.run_one(task, group_id="g", sample_index=0), faults


async def test_claimed_pod_deleted_mid_trajectory_is_infra_error_then_retried(cluster: Any,
                                                                            smollm2_tokenizer: Any) -> None:
    from agentrl.types import Status

    async def delete(pod: str) -> str:  # the sandbox of the first attempt dies while the model "thinks"
        await cluster.delete_pod(pod)
        return pod

    traj, killed = await _episode_with_a_fault(cluster, cluster.backend(warm=1), smollm2_tokenizer, delete,
                                               "retry-run")
    assert killed and traj.attempt == 1, "the first attempt must have failed as infra and been retried"
    assert traj.status is Status.ok and traj.reward == 1.0, traj.error


async def test_the_bearer_token_is_never_logged(fake_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.DEBUG)
    fake_cluster.fake.inject("create", "pods", 503, times=1)
    backend = fake_cluster.backend(backoff_base_s=0.01)
    handle = await backend.create(fake_cluster.spec, {})
    sb = Sandbox(handle, fake_cluster.spec)
    await sb.exec("echo hi")
    await fake_cluster.delete_pod(handle.id)
    with pytest.raises(SandboxDiedError) as err:
        for _ in range(100):
            await sb.exec("echo again", timeout=5)
            await asyncio.sleep(0.05)
    await sb.close()
    await backend.destroy(handle)
    token = handle.endpoint.token
    assert token and len(token) == 64
    for text in (caplog.text, str(err.value), repr(handle), repr(sb), str(backend.stats())):
        assert token not in text
    assert not any(token in str(p) for p in fake_cluster.fake.objects("pods") + fake_cluster.fake.objects("secrets"))


K8S_RESOURCE_ATTACKS = {  # on the old single-container pod these took the agent's pids / memory (issue 22)
    "daemon_fills_the_pods_pids": "import subprocess, time\nsubprocess.Popen(['setsid', 'python3', '-c', "
                                  "'import os, time\\nwhile True:\\n try:\\n  os.fork() or time.sleep(1000)\\n "
                                  "except OSError:\\n  time.sleep(0.005)'])\ntime.sleep(1)",
    "fork_bomb_then_memory_fill": "import os, subprocess, time\nsubprocess.Popen(['setsid', 'python3', '-c', "
                                  "'import os\\nwhile True:\\n try:\\n  os.fork()\\n except OSError:\\n  pass'])\n"
                                  "time.sleep(0.5)\nb = [bytearray(16 << 20) for _ in range(64)]",
}


@pytest.mark.k8s
@pytest.mark.timeout(300)
@pytest.mark.parametrize("attack", sorted(K8S_RESOURCE_ATTACKS))
async def test_a_policy_exhausting_its_pod_is_still_graded_on_its_answer(real_cluster: Any, smollm2_tokenizer: Any,
                                                                         attack: str) -> None:
    """Through the real runner on a real pod: the policy writes the right answer, then fills the pod's pids (and
    its memory) from daemons. The agent's container is outside the commands' memory and CPU, keeps its threads and
    kills without forking, so the episode is graded on its answer (1.0): neither infra_error (a dodge) nor a
    policy error charged for a dead agent."""
    from agentrl.envs import get_env
    from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
    from agentrl.sandbox import SandboxPool
    from agentrl.testing.scripted import ScriptedEngine
    from agentrl.tools.render import ChatRenderer
    from agentrl.types import SamplingParams, Status

    env = get_env("code_tests", source="easy")
    task = next(iter(env.tasks()))
    replies = [f"Here is my solution.\n```python\n{task.data['reference']}\n```",
               f"Here is my solution.\n```python\n{K8S_RESOURCE_ATTACKS[attack]}\n```"]
    engine = ScriptedEngine(smollm2_tokenizer, replies)
    spec = env.sandbox_spec.model_copy(update={"cpus": 0.5, "memory": "256m"})
    rollout = Rollout(env=env, engine=engine, renderer=ChatRenderer(smollm2_tokenizer),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=512,
                                              stop_token_ids=[smollm2_tokenizer.eos_token_id]),
                      budgets=Budgets(max_turns=2, max_completion_tokens=4096, context_window=8192,
                                      tool_timeout_s=60))
    async with SandboxPool(real_cluster.backend(), spec, max_sandboxes=2, run_id=f"exhaust-{attack[:20]}") as pool:
        sched = Scheduler(rollout, pool, SchedulerConfig(group_size=1, infra_retries=2, finalize_timeout_s=90))
        traj = await sched.run_one(task, group_id="g", sample_index=0)
    assert traj.status not in (Status.infra_error, Status.policy_error), f"{attack}: {traj.error_kind} {traj.error}"
    assert traj.attempt == 0
    assert traj.tests is not None and traj.tests.passed == traj.tests.total >= 1, traj.tests
    assert traj.reward == 1.0


def _kill_agent_of(pod: str) -> int:
    """SIGKILL, from the host, the agent process of `pod` (its command line names the pod's relay): what a node
    admin or a crashing runtime does. The host sees every pod's processes."""
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"agent.pyz") for a in argv) and f"agentrl-relay-{pod}".encode() in argv:
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
    return killed


@pytest.mark.k8s
@pytest.mark.timeout(300)
async def test_the_agent_killed_from_outside_is_infra_and_retried(real_cluster: Any, smollm2_tokenizer: Any) -> None:
    """The agent has its own container, which no command can signal or fill: its death by a signal (here SIGKILL
    from the host while the model thinks) is an outside cause, infra_error and retried, and the retry scores. With
    the agent in the commands' container this was charged to the policy (resources shared: no proof)."""
    from agentrl.types import Status

    async def kill_the_agent(pod: str) -> int:
        return await asyncio.to_thread(_kill_agent_of, pod)

    traj, killed = await _episode_with_a_fault(real_cluster, real_cluster.backend(), smollm2_tokenizer,
                                               kill_the_agent, "agent-killed")
    assert killed == [1], killed
    assert traj.attempt == 1, f"the first attempt must have been infra and retried: {traj.status} {traj.error_kind}"
    assert traj.status is Status.ok and traj.reward == 1.0, traj.error
