"""The in-sandbox agent's peak memory while it carries big data (issue 31 item 6): a file written and read back, and
a tree shipped as a tar, unpacked, packed again and read back (what repo_fix's fresh grading and its collect do).
The agent's memory should be flat: independent of the data's size.

    python benchmarks/bench_agent_memory.py [--mb 200] [--backends local,docker,docker-two,k8s]

Backends: local (bubblewrap), docker (the layout `auto` picks: host cgroups on a cgroup-v1 cgroupfs engine, else two
containers), docker-two (separation="containers": the agent in a container of its own) and k8s (a pod of the dev
cluster, KUBECONFIG set: the agent's container of its own, read through the cluster's dockerd on this host). Per backend and step it
prints the agent's VmHWM (the kernel's peak resident set of the agent's process, read on the host from
/proc/<pid>/status; it only grows) and, for docker-two, the agent container's memory cgroup peak (which also counts
the tmpfs pages the agent wrote: the files it carries for the host stay on that bill until removed). A step that
fails (the agent refused the size, or died) is printed with its error and ends that backend's run.

To measure the code before a change, run this script with PYTHONPATH pointing at the old tree (it uses only
Sandbox.write_file / read_bytes / exec, which both protocols have) and agentrl/testing/agent_memory.py copied in.
Needs root (bubblewrap's uid separation, the docker tier), and, for docker, the image agentrl/python:latest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl.sandbox import Sandbox, SandboxSpec
from agentrl.testing.agent_memory import agent_pid, docker_root_pid, file_round_trip, peak_kib, tree_round_trip

IMAGE = "agentrl/python:latest"


def _cgroup_peak(container_id: str) -> int | None:
    """Peak memory of a docker container's cgroup (v1 max_usage_in_bytes, v2 memory.peak), None when not found."""
    for path in (f"/sys/fs/cgroup/memory/docker/{container_id}/memory.max_usage_in_bytes",
                 f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.peak",
                 f"/sys/fs/cgroup/docker/{container_id}/memory.peak"):
        try:
            return int(Path(path).read_text())
        except OSError:
            continue
    return None


async def _steps(sb: Sandbox, size: int, pid: int, cgroup: Any) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []

    def note(step: str) -> None:
        mib = peak_kib(pid) / 1024
        extra = f", container cgroup peak {cgroup() / 2**20:.0f} MiB" if cgroup and cgroup() else ""
        rows.append((step, f"VmHWM {mib:.1f} MiB{extra}"))

    note("start")
    t = time.monotonic()
    await file_round_trip(sb, pid, size)
    note(f"wrote a {size >> 20} MB file and read it back byte-exact ({time.monotonic() - t:.1f} s)")
    t = time.monotonic()
    await tree_round_trip(sb, pid, size)
    note(f"shipped a {size >> 20} MB tree, unpacked, packed, read back ({time.monotonic() - t:.1f} s)")
    return rows


async def _run(kind: str, size: int) -> list[tuple[str, str]]:
    spec = SandboxSpec(image=IMAGE, memory="1g", disk=f"{max(3 * size >> 20, 256)}m", ttl_s=900)
    labels = {"agentrl.run_id": f"bench-mem-{uuid.uuid4().hex[:6]}"}
    cgroup = None
    if kind == "local":
        from agentrl.sandbox.local import LocalBackend

        backend: Any = LocalBackend()
        handle = await backend.create(spec, labels)
        root = backend._live[handle.id].proc.pid
    elif kind == "k8s":  # the dev cluster (KUBECONFIG; make test-k8s sets it up): pods are processes of this host
        from agentrl.sandbox.kubernetes import KubernetesBackend

        backend = KubernetesBackend(namespace=os.environ.get("AGENTRL_K8S_NAMESPACE", "agentrl"),
                                    pool=f"bench{uuid.uuid4().hex[:6]}", image_pull_policy="IfNotPresent")
        handle = await backend.create(spec.model_copy(update={"cpus": 0.5}), labels)
        pod_name = backend._pod_names.get(handle.id, handle.id)
        pod = await backend.api.request("GET", f"/api/v1/namespaces/{backend.config.namespace}/pods/{pod_name}")
        (agent,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "agentrl-agent"]
        sock = Path(os.environ.get("AGENTRL_K8S_DIR", Path.home() / ".cache/agentrl/k8s"), "docker/docker.sock")
        root = docker_root_pid(agent["containerID"].removeprefix("docker://"), base_url=f"unix://{sock}")
    else:
        from agentrl.sandbox.docker import DockerBackend

        backend = DockerBackend(separation="containers" if kind == "docker-two" else "auto")
        handle = await backend.create(spec, labels)
        root = docker_root_pid(handle.id)
        if kind == "docker-two":
            import docker

            client = docker.from_env(timeout=30)
            cid = client.api.inspect_container(handle.id)["Id"]
            client.close()

            def cgroup() -> int | None:
                return _cgroup_peak(cid)
    sb = Sandbox(handle, spec)
    try:
        await sb.health()
        pid = agent_pid(root)
        try:
            return await _steps(sb, size, pid, cgroup)
        except Exception as e:  # noqa: BLE001 - the old agent refuses or dies: that is the measurement
            return [("failed", f"{type(e).__name__}: {str(e)[:200]}")]
    finally:
        await sb.close()
        await backend.destroy(handle)
        close = getattr(backend, "close", None)
        if close is not None:
            await close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="size of the file and of the tree, MB (MiB)")
    ap.add_argument("--backends", default="local,docker,docker-two")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}")
    print("| backend | step | agent memory |\n|---|---|---|")
    for kind in args.backends.split(","):
        for step, value in await _run(kind, args.mb << 20):
            print(f"| {kind} | {step} | {value} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
