"""What only a real API server and kubelet do, checked on one (the `k8s` tier; `make test-k8s` on the dev cluster):
warm pods answering on their pod IP with their own token, activeDeadlineSeconds really ending a pod, cgroup memory
and pids limits, the pod's hardening as the container sees it, and pods left by a worker killed with -9 removed by
the next start's sweep and by `agentrl sandbox gc`. The behaviours the fake API scripts (conflicts, deletions,
retries) run here too through the `cluster` fixture of the other files."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from agentrl.errors import SandboxDiedError, SandboxError
from agentrl.sandbox import Sandbox, SandboxPool
from agentrl.sandbox.kubernetes.pods import L_STATE, derive_token, is_ready
from agentrl.testing import sandbox_attacks

NAMESPACE = os.environ.get("AGENTRL_K8S_NAMESPACE", "agentrl")

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]


async def _ready_pods(cluster: Any, n: int, state: str = "warm") -> list[dict[str, Any]]:
    async with asyncio.timeout(120):
        while len(ready := [p for p in await cluster.pods(f"{L_STATE}={state}") if is_ready(p)]) < n:
            await asyncio.sleep(0.2)
    return ready


async def _run(sb: Sandbox, cmd: str, **kw: Any) -> Any:
    return await sb.exec(cmd, timeout=kw.pop("timeout", 30), **kw)


async def test_warm_pods_answer_on_their_pod_ip_with_their_own_token(real_cluster: Any) -> None:
    filler = real_cluster.backend(warm=2, max_pending=2, keep_warm_on_close=True)
    await filler.warm_up(real_cluster.spec)
    pods = await _ready_pods(real_cluster, 2)
    await filler.close()
    backend = real_cluster.backend()
    handle = await backend.create(real_cluster.spec, {"agentrl/run-id": "warm-ip"})
    assert handle.timings["warm_hit"] == 1.0, "a ready warm pod was there to claim"
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    assert handle.endpoint.address == f"{ips[handle.id]}:{backend.config.agent_port}"
    sb = Sandbox(handle, real_cluster.spec)
    try:
        r = await _run(sb, "hostname; echo $POD_IP")
        assert r.stdout.split() == [handle.id, ips[handle.id]]
        # the other warm pod: its IP answers, but not to this pod's token, only to its own
        other = next(n for n in ips if n != handle.id)
        wrong = replace(handle, id=other, endpoint=replace(handle.endpoint, address=f"{ips[other]}:8765"))
        stranger = Sandbox(wrong, real_cluster.spec)
        with pytest.raises(SandboxError, match="401|token|Unauthorized"):
            await _run(stranger, "true")
        await stranger.close()
        right = replace(wrong, endpoint=replace(wrong.endpoint, token=derive_token(backend._key, other)))
        owner = Sandbox(right, real_cluster.spec)
        assert (await _run(owner, "hostname")).stdout.strip() == other
        await owner.close()
    finally:
        await sb.close()
        await backend.destroy(handle)


async def test_pod_hardening_as_the_container_sees_it(real_cluster: Any) -> None:
    backend = real_cluster.backend()
    handle = await backend.create(real_cluster.spec, {})
    sb = Sandbox(handle, real_cluster.spec)
    try:
        assert (await _run(sb, "id -u; id -g")).stdout.split() == ["1000", "1000"]
        r = await _run(sb, "ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1; grep -c serviceaccount /proc/mounts")
        assert "No such file" in r.stdout and r.stdout.split()[-1] == "0", r.stdout
        r = await _run(sb, "awk '$2 == \"/\" {print $4}' /proc/mounts; touch /x 2>&1; touch /etc/x 2>&1; "
                           "touch /workspace/ok /tmp/ok && echo writable-ok")
        assert r.stdout.startswith("ro,") and r.stdout.count("Read-only file system") == 2, r.stdout
        assert "writable-ok" in r.stdout, r.stdout
        r = await _run(sb, "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status")
        fields = dict(line.split(":\t") for line in r.stdout.strip().splitlines())
        assert fields == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}, fields
    finally:
        await sb.close()
        await backend.destroy(handle)


async def test_memory_limit_kills_the_hog_not_the_sandbox(real_cluster: Any) -> None:
    backend = real_cluster.backend()
    handle = await backend.create(real_cluster.spec, {})  # memory 128m
    sb = Sandbox(handle, real_cluster.spec)
    try:
        limit = (await _run(sb, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || "
                                "cat /sys/fs/cgroup/memory.max")).stdout.strip()
        assert limit == str(128 << 20)
        r = await _run(sb, "python3 -c 'b = bytearray(400 << 20); print(\"alive\")'")
        assert r.exit_code != 0 and "alive" not in r.stdout, r
        assert (await _run(sb, "echo still-here")).stdout == "still-here\n"
        assert await backend.alive(handle)
    finally:
        await sb.close()
        await backend.destroy(handle)


PIDS_PROBE = """
import errno, subprocess
kids, err = [], 0
try:
    for _ in range(4096):
        kids.append(subprocess.Popen(["sleep", "60"]))
except OSError as e:
    err = e.errno
for k in kids:
    k.kill()
    k.wait()
print(len(kids), err == errno.EAGAIN)
"""


async def _node_pids_limit(cluster: Any) -> int:
    nodes = (await cluster.kube.request("GET", "/api/v1/nodes"))["items"]
    name = nodes[0]["metadata"]["name"]
    cfg = await cluster.kube.request("GET", f"/api/v1/nodes/{name}/proxy/configz")
    return int(cfg["kubeletconfig"].get("podPidsLimit") or -1)


async def test_pids_limit_stops_a_fork_storm_and_the_sandbox_survives(real_cluster: Any) -> None:
    limit = await _node_pids_limit(real_cluster)
    if limit <= 0:
        pytest.skip("the node sets no podPidsLimit (Kubernetes limits pids per pod through the kubelet)")
    backend = real_cluster.backend()
    spec = real_cluster.spec.model_copy(update={"memory": "512m"})  # ~250 processes: pids, not memory, must bind
    handle = await backend.create(spec, {})
    sb = Sandbox(handle, spec)
    try:
        await sb.write_file("probe.py", PIDS_PROBE)
        r = await _run(sb, "python3 probe.py", timeout=120)
        started, eagain = r.stdout.split()
        assert eagain == "True" and 0 < int(started) < limit, (r.stdout, r.stderr, limit)
        assert (await _run(sb, "echo still-here")).stdout == "still-here\n"
    finally:
        await sb.close()
        await backend.destroy(handle)


async def test_active_deadline_really_ends_the_pod_and_the_sweep_removes_it(real_cluster: Any) -> None:
    backend = real_cluster.backend()
    spec = real_cluster.spec.model_copy(update={"ttl_s": 10})
    handle = await backend.create(spec, {})
    sb = Sandbox(handle, spec)
    assert (await _run(sb, "echo fresh")).stdout == "fresh\n"
    async with asyncio.timeout(60):
        while await backend.alive(handle):
            await asyncio.sleep(0.2)
    with pytest.raises(SandboxDiedError):
        for _ in range(150):  # reported Failed first: a loaded kubelet may still be killing its containers
            await _run(sb, "echo late")
            await asyncio.sleep(0.2)
    await sb.close()
    pod = next(p for p in await real_cluster.pods() if p["metadata"]["name"] == handle.id)
    assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "DeadlineExceeded", pod["status"]
    assert await real_cluster.backend().sweep() >= 1
    async with asyncio.timeout(30):
        while handle.id in {p["metadata"]["name"] for p in await real_cluster.pods()}:
            await asyncio.sleep(0.2)


WORKER = """
import asyncio, sys
from agentrl.sandbox import SandboxSpec
from agentrl.sandbox.kubernetes import KubernetesBackend

async def main(namespace, pool, spec_json, n):
    backend = KubernetesBackend(namespace=namespace, pool=pool, image_pull_policy="IfNotPresent")
    spec = SandboxSpec.model_validate_json(spec_json)
    handles = [await backend.create(spec, {"agentrl/run-id": "killed-run"}) for _ in range(int(n))]
    print(" ".join(h.id for h in handles), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


def _worker_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


async def _killed_worker(cluster: Any, n: int) -> list[str]:
    """A worker process that claims `n` sandboxes, then dies by SIGKILL: no cleanup of any kind runs."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WORKER, NAMESPACE, cluster.pool, cluster.spec.model_dump_json(), str(n),
        stdout=subprocess.PIPE, env=_worker_env())
    try:
        async with asyncio.timeout(120):
            line = await proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    names = line.decode().split()
    assert len(names) == n, f"the worker did not start its sandboxes: {line!r}"
    return names


async def _gone(cluster: Any, names: list[str]) -> None:
    async with asyncio.timeout(60):
        while set(names) & {p["metadata"]["name"] for p in await cluster.pods()
                            if not p["metadata"].get("deletionTimestamp")}:
            await asyncio.sleep(0.2)


async def test_pods_of_a_worker_killed_with_sigkill_are_swept_at_the_next_start(real_cluster: Any) -> None:
    names = await _killed_worker(real_cluster, 2)
    left = {p["metadata"]["name"] for p in await real_cluster.pods()}
    assert set(names) <= left, "SIGKILL left the claimed pods behind"
    backend = real_cluster.backend()
    async with SandboxPool(backend, real_cluster.spec, max_sandboxes=1, run_id="next-run") as pool:
        await _gone(real_cluster, names)  # the pool's start-up sweep removed them
        async with pool.lease() as sb:
            assert (await sb.exec("echo next")).stdout == "next\n"


async def test_pods_of_a_worker_killed_with_sigkill_are_removed_by_sandbox_gc(real_cluster: Any) -> None:
    if NAMESPACE != "agentrl":
        pytest.skip("`agentrl sandbox gc --backend kubernetes` works on the configured namespace (agentrl)")
    names = await _killed_worker(real_cluster, 2)
    gc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrl.cli", "sandbox", "gc", "--backend", "kubernetes",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_worker_env())
    out, _ = await gc.communicate()
    assert gc.returncode == 0, out.decode()
    removed = int(out.decode().split("removed ")[-1].split()[0])
    assert removed >= 2, out.decode()
    await _gone(real_cluster, names)


async def test_commands_run_as_uid_1000_and_cannot_kill_the_agent(real_cluster: Any) -> None:
    backend = real_cluster.backend()
    handle = await backend.create(real_cluster.spec, {})
    sb = Sandbox(handle, real_cluster.spec)
    try:
        assert (await _run(sb, "id -u")).stdout.strip() == "1000"
        # the pod's processes as a command sees them (one pid namespace): pid 1 (pause), the agent, the relay
        uids = (await _run(sb, "for p in 1 $(grep -ls -e 'agen[t].py' -e 'agentrl rela[y]' /proc/[0-9]*/cmdline | "
                               "cut -d/ -f3); do awk '/^Uid:/ {print $2}' /proc/$p/status; done")).stdout.split()
        assert len(uids) >= 3 and "1000" not in uids, f"a control-plane process runs as the commands' uid: {uids}"
        # graders start from an execute-only python3 in the commands' container: non-dumpable from exec
        assert await sb.health() and sb.judge_python, sb.agent_info
        r = await _run(sb, f"{sb.judge_python} -I -S -c 'import time; time.sleep(3)' & sleep 0.5; "
                           f"stat -c %U /proc/$!/mem; cat {sb.judge_python} > /dev/null 2>&1 || echo unreadable")
        assert r.stdout.split()[-2:] == ["root", "unreadable"], r
        await _run(sb, "kill -TERM 1; kill -KILL 1; for p in /proc/[0-9]*; do grep -qs -e 'agen[t].py' "
                       "-e 'agentrl rela[y]' $p/cmdline && kill -KILL ${p#/proc/}; done; true", timeout=10)
        await asyncio.sleep(1)
        assert (await _run(sb, "echo agent-alive")).stdout == "agent-alive\n"
    finally:
        await sb.close()
        await backend.destroy(handle)


# ---------------------------------------------------------------- the agent's own resources (issue 22)


@pytest.mark.parametrize("attack", (*sandbox_attacks.RESOURCE_ATTACKS,
                                    sandbox_attacks.attack_busy_loops_in_the_cpu_quota, *sandbox_attacks.ALL),
                         ids=lambda f: f.__name__)
async def test_commands_cannot_exhaust_the_agents_resources(real_cluster: Any, attack: Any) -> None:
    """The agent has a container of its own: the commands' memory limit (SysV memory no process holds, a fill after
    lowering oom_score_adj), the pod's pids (a daemon holding every pid) and the commands' CPU quota (busy loops)
    are the commands' only: the agent answers on old and new connections, kill_all() ends the attack without a
    fork, and the next command runs. The control-plane attacks of the local and docker tiers (kill, signal, read,
    ptrace the agent; daemons; the spawner) hold in the shared pid namespace too."""
    limit = await _node_pids_limit(real_cluster)
    cpus = 0.05 if attack is sandbox_attacks.attack_busy_loops_in_the_cpu_quota else 0.5
    spec = real_cluster.spec.model_copy(update={"memory": "256m", "cpus": cpus,
                                                "pids": max(limit - 32, 32) if limit > 0 else 128})
    backend = real_cluster.backend()
    handle = await backend.create(spec, {})
    sb = Sandbox(handle, spec)
    try:
        assert await sb.health() and sb.resources_separated and sb.uid_separated, sb.agent_info
        assert await sandbox_attacks.shm_rmid_forced(sb), "the pod's IPC namespace keeps detached SysV segments"
        await attack(sb)
        assert await backend.alive(handle) and await backend.death_cause(handle) is None
    finally:
        await sb.close()
        await backend.destroy(handle)


FLOOD = """
import os, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=2)
    except OSError:
        continue
    if i % 2:
        s.sendall(b"POST /exec HTTP/1.1\\r\\nHost: agent\\r\\n")  # a head that never ends
    held.append(s)
print(len(held), flush=True)
time.sleep(20)
"""


async def test_a_connection_flood_from_inside_the_pod_leaves_the_agent_serving(real_cluster: Any) -> None:
    """A command holds hundreds of connections to the agent's port (the pod's network namespace is shared): the
    agent gives them no thread and the host's new connections are still served."""
    backend = real_cluster.backend()
    spec = real_cluster.spec.model_copy(update={"memory": "256m", "cpus": 0.5})
    handle = await backend.create(spec, {})
    sb = Sandbox(handle, spec)
    try:
        host, port = handle.endpoint.address.rsplit(":", 1)
        await sb.write_file("flood.py", FLOOD)
        r = await _run(sb, f"setsid python3 flood.py {host.strip('[]')} {port} 400 > flood.out 2>&1 < /dev/null & "
                           "sleep 6; cat flood.out", timeout=30)
        assert int(r.stdout.split()[0]) >= 200, r
        for _ in range(3):
            fresh = Sandbox(handle, spec)
            async with asyncio.timeout(20):
                assert (await fresh.exec("echo served")).stdout == "served\n"
            await fresh.close()
        assert await sb.kill_all() >= 1
    finally:
        await sb.close()
        await backend.destroy(handle)
