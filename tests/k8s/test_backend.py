"""The kubernetes backend end to end: pods, warm pool, claims, deaths, no exec. Runs against the fake API edge (real
agent processes behind it) and, under the `k8s` mark, against a real cluster."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentrl.errors import SandboxDiedError
from agentrl.sandbox import Sandbox, SandboxPool
from agentrl.sandbox.kubernetes.pods import L_OWNER, L_STATE, is_ready

pytestmark = pytest.mark.timeout(120)


def _exec_calls(calls: dict[str, int]) -> int:
    return sum(n for key, n in calls.items() if "exec" in key or "attach" in key)


async def test_sandbox_pod_runs_commands_with_constant_api_calls(cluster: Any) -> None:
    backend = cluster.backend()
    handle = await backend.create(cluster.spec, {"agentrl/run-id": "run-a"})
    sb = Sandbox(handle, cluster.spec)
    try:
        assert handle.endpoint.kind == "tcp" and handle.endpoint.token
        before = dict(backend.api.calls)
        await sb.write_file("solution.py", "print(6 * 7)\n")
        for _ in range(20):
            r = await sb.exec("python3 solution.py")
            assert r.exit_code == 0 and r.stdout == "42\n"
        assert await sb.read_file("solution.py") == "print(6 * 7)\n"
        assert dict(backend.api.calls) == before, "commands must never touch the API server"
        pod = (await cluster.pods(f"{L_STATE}=claimed"))[0]
        assert pod["metadata"]["labels"]["agentrl.io/run-id"] == "run-a"
        assert pod["metadata"]["labels"][L_OWNER] == backend.owner.session
        assert await backend.alive(handle)
    finally:
        await sb.close()
        await backend.destroy(handle)
    assert not [p for p in await cluster.pods() if not p["metadata"].get("deletionTimestamp")]
    assert _exec_calls(backend.api.calls) == 0
    assert backend.api.calls["get pods"] == 0, "readiness comes from the watch, not from polling the pod"
    if cluster.fake is not None:
        assert _exec_calls(cluster.fake.calls) == 0


async def test_wrong_token_is_refused(cluster: Any) -> None:
    from dataclasses import replace

    from agentrl.errors import SandboxError

    backend = cluster.backend()
    handle = await backend.create(cluster.spec, {})
    forged = replace(handle, endpoint=replace(handle.endpoint, token="0" * 64))
    sb = Sandbox(forged, cluster.spec)
    try:
        with pytest.raises(SandboxError, match="401|token|Unauthorized"):
            await sb.exec("true")
    finally:
        await sb.close()
        await backend.destroy(handle)


async def _fill(cluster: Any, n: int) -> None:
    filler = cluster.backend(warm=n, max_pending=n, keep_warm_on_close=True)
    await filler.warm_up(cluster.spec)
    async with asyncio.timeout(90):
        while sum(1 for p in await cluster.pods("agentrl.io/state=warm") if is_ready(p)) < n:
            await asyncio.sleep(0.2)
    await filler.close()  # the pool now holds exactly n ready pods and nobody refills it


async def test_claims_from_4_workers_on_a_shared_pool_never_double_assign(cluster: Any) -> None:
    # twice as many claims as warm pods, all at once: fake 64 on 32; real 16 on 8 (a 2-core node holds ~16 pods)
    n = 32 if cluster.fake is not None else 8
    await _fill(cluster, n)
    workers = [cluster.backend() for _ in range(4)]
    start = asyncio.Event()

    async def lease(w: Any, k: int) -> tuple[Any, Any]:
        await start.wait()
        return w, await w.create(cluster.spec, {"agentrl/run-id": f"race-{k}"})

    tasks = [asyncio.create_task(lease(w, k)) for w in workers for k in range(n // 2)]
    start.set()
    got = await asyncio.gather(*tasks)
    names = [h.id for _, h in got]
    assert len(names) == 2 * n and len(set(names)) == 2 * n
    warm = [h for _, h in got if h.timings["warm_hit"]]
    assert 0 < len(warm) <= n
    assert sum(w.plane.counters["claim_conflicts"] for w in workers) > 0, f"{2 * n} claims on {n} pods must race"
    pods = {p["metadata"]["name"]: p for p in await cluster.pods()}
    for w, h in got:
        assert pods[h.id]["metadata"]["labels"][L_OWNER] == w.owner.session
    # the data plane agrees: every lease writes its marker, then reads back its own, in overlapping order
    sandboxes = [Sandbox(h, cluster.spec) for _, h in got]
    await asyncio.gather(*(sb.write_file("owner.txt", sb.id) for sb in sandboxes))
    assert await asyncio.gather(*(sb.read_file("owner.txt") for sb in sandboxes)) == [sb.id for sb in sandboxes]
    for sb in sandboxes:
        await sb.close()
    await asyncio.gather(*(w.destroy(h) for w, h in got))


async def test_pod_deleted_mid_trajectory_is_sandbox_died(cluster: Any) -> None:
    backend = cluster.backend()
    handle = await backend.create(cluster.spec, {})
    sb = Sandbox(handle, cluster.spec)
    try:
        assert (await sb.exec("echo up")).stdout == "up\n"
        await cluster.delete_pod(handle.id)
        with pytest.raises(SandboxDiedError):
            for _ in range(100):  # the first calls may still land while the pod terminates
                await sb.exec("echo still-here", timeout=5)
                await asyncio.sleep(0.05)
        async with asyncio.timeout(30):
            while await backend.alive(handle):
                await asyncio.sleep(0.05)
    finally:
        await sb.close()
        await backend.destroy(handle)


async def test_sandbox_pool_leases_over_the_backend(cluster: Any) -> None:
    backend = cluster.backend(warm=2)
    async with SandboxPool(backend, cluster.spec, max_sandboxes=4, run_id="pool-run") as pool:
        async def one(i: int) -> str:
            async with pool.lease() as sb:
                r = await sb.exec(f"echo {i} > n.txt && cat n.txt")
                return r.stdout.strip()

        assert sorted(await asyncio.gather(*(one(i) for i in range(6)))) == [str(i) for i in range(6)]
    await backend.close()
    deadline = time.monotonic() + 10  # the deletes of close() may still be landing
    while (left := [p for p in await cluster.pods() if not p["metadata"].get("deletionTimestamp")]) and (
            time.monotonic() < deadline):
        await asyncio.sleep(0.1)
    assert not left, [(p["metadata"]["name"], p["metadata"]["labels"].get("agentrl.io/state")) for p in left]


async def test_start_failure_is_fast_and_cleans_up(fake_cluster: Any) -> None:
    from agentrl.errors import SandboxStartError

    fake_cluster.kubelet.bad_images = frozenset({"missing:latest"})
    backend = fake_cluster.backend()
    t0 = time.monotonic()
    with pytest.raises(SandboxStartError, match="ImagePullBackOff"):
        await backend.create(fake_cluster.spec.model_copy(update={"image": "missing:latest"}), {})
    assert time.monotonic() - t0 < backend.config.start_timeout_s
    async with asyncio.timeout(10):
        while await fake_cluster.pods():
            await asyncio.sleep(0.05)


async def test_close_deletes_a_warm_pod_that_changed_between_its_list_and_its_delete(fake_cluster: Any) -> None:
    """close() lists its own warm pods, then deletes each at the listed resourceVersion (so that another worker's
    claim wins). A status update in between (the kubelet's, on a starting pod) made that delete a 409, and the pod
    outlived the run (CI: test_sandbox_pool_leases_over_the_backend[fake])."""
    from agentrl.sandbox.kubernetes.api import MERGE_PATCH

    backend = fake_cluster.backend(warm=1)
    await backend.warm_up(fake_cluster.spec)
    async with asyncio.timeout(20):
        while not await fake_cluster.pods("agentrl.io/state=warm"):
            await asyncio.sleep(0.05)
    plane = backend.plane
    delete = plane._delete
    bumped: list[str] = []

    async def racing_delete(name: str, rv: str | None = None) -> bool:
        if rv is not None and not bumped:  # what a status update does between the list and the delete
            await fake_cluster.kube.request("PATCH", fake_cluster.path(name), content_type=MERGE_PATCH,
                                            body={"metadata": {"annotations": {"test/bump": "1"}}})
            bumped.append(name)
        return await delete(name, rv)

    plane._delete = racing_delete
    await backend.close()
    assert bumped
    left = [p for p in await fake_cluster.pods() if not p["metadata"].get("deletionTimestamp")]
    assert not left, [p["metadata"]["name"] for p in left]
