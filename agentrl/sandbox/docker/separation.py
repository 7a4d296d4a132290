"""Resource separation of the docker backend: which layout keeps the agent's resources from the commands', and
what the host-cgroups layout adds to the container. The probe asks the engine (`docker info`) and this host's
cgroup hierarchies; the rest is pure.

Resource separation (`resources_separated`; `separation`: "auto" picks the first that works, "cgroups",
"containers" or "off"). Host cgroups (when the host side is root, the engine is local, its cgroup driver is
cgroupfs and the host has cgroup v1): like the local backend, each sandbox gets a host cgroup per hierarchy with an
`agent` and a `commands` child (`limits.Limiter.prepare(..., separate=True)`), the spec's memory / pids / CPU limits
on `commands`. The container is created under `agent` (`cgroup_parent`), so docker-init, the agent and its spawner
live there with only the agent's pids limit; the sandbox's cgroup directories are bind-mounted at /agentrl-cgroup/N
(root-owned files: commands, uid 1000, cannot write them) and the agent starts every command in `commands`
(`--cgroups v1:...`) and kills through it. A command filling memory, pids or CPU then hits only its own limits: the
kernel's OOM killer picks inside `commands`, never the agent. Two containers (any engine the host side is root
of: cgroup v2, the systemd driver): the agent's container (its own 0.25 CPU, pids, and 256 MiB plus room for every
tmpfs volume it writes into: `specs.agent_container_memory`) and `<name>-cmd`, the commands' container with the
spec's limits, in the agent container's pid, ipc and network namespaces, both mounting
the same tmpfs volumes (`<name>-vN`: /agentrl, /workspace, /tmp, the writable dirs); its main process is the relay
(agent/relay_program.py, as text: root with SETUID / SETGID only), which starts the agent's command spawner there, as on
Kubernetes. A non-root host side gets neither: the container's limits cover the agent and its commands together
and the agent says so (`resources_separated: false`); every death is then the policy's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrl.sandbox import limits

SEPARATIONS = ("auto", "cgroups", "containers", "off")
CGROUP_MOUNT = "/agentrl-cgroup"  # where they appear in the container: /agentrl-cgroup/0, /1, ...


def hierarchy_path(cgroup_dir: str) -> str | None:
    """`/sys/fs/cgroup/<controller>/a/b` -> `/a/b` (what docker's cgroupfs driver takes as a cgroup parent)."""
    parts = Path(cgroup_dir).parts
    if len(parts) < 5 or parts[:4] != ("/", "sys", "fs", "cgroup"):
        return None
    return "/" + "/".join(parts[5:])


def probe(api: Any, *, separation: str, root_host: bool,
          docker_host: str | None) -> tuple[limits.Limiter | None, str, str]:
    """The layout for `separation` (one of SEPARATIONS) on this host and engine: (the host cgroups' limiter or None,
    "cgroups" | "containers" | "" (one budget), why not the better one ("" when nothing to say)). Blocking: asks
    `api` (a docker.APIClient) for `docker info` and may create this host's sandbox cgroup parents."""
    if separation == "off":
        return None, "", "separation off (separate_resources=False)"
    if not root_host:
        return None, "", "not running as root: the commands cannot get a uid of their own"
    if separation == "containers":
        return None, "containers", ""
    limiter, why = probe_cgroups(api, docker_host)
    if limiter is not None:
        return limiter, "cgroups", ""
    if separation == "auto":
        return None, "containers", f"no host cgroups: {why}"
    return None, "", why


def probe_cgroups(api: Any, docker_host: str | None) -> tuple[limits.Limiter | None, str]:
    """Host cgroups for the sandboxes of this engine, or why none: it must be local and use cgroupfs on v1."""
    base_url = docker_host or os.environ.get("DOCKER_HOST") or "unix://"
    if not base_url.startswith(("unix://", "/")):
        return None, f"the Docker Engine at {base_url} is not local"
    try:
        info = api.info()
    except Exception as e:  # noqa: BLE001 - no separation then, the container still starts
        return None, f"docker info failed: {e}"
    driver, version = info.get("CgroupDriver"), str(info.get("CgroupVersion") or "1")
    if driver != "cgroupfs" or version != "1":
        return None, f"the engine uses the {driver} cgroup driver on cgroup v{version}; only cgroupfs on v1 is " \
                     "supported so far"
    try:
        limiter = limits.v1_at_root("agentrl-docker")
    except (OSError, ValueError) as e:
        return None, f"no writable cgroup v1 hierarchy for sandbox cgroups ({e})"
    rel = {hierarchy_path(p) for p in limiter.parents}
    if len(rel) != 1 or None in rel:
        return None, f"the sandbox cgroups are not at one path in every hierarchy ({', '.join(limiter.parents)})"
    return limiter, ""


def separated_config(plan: limits.LimitPlan) -> tuple[dict, dict, list[str]]:
    """Host-config fields, extra binds and agent arguments of a resource-separated (host cgroups) container."""
    parent = hierarchy_path(plan.launch_cgroups[0])
    binds = {cg: {"bind": f"{CGROUP_MOUNT}/{i}", "mode": "rw"} for i, cg in enumerate(plan.cgroups)}
    args = ["--cgroups", "v1:" + ":".join(f"{CGROUP_MOUNT}/{i}" for i in range(len(plan.cgroups)))]
    return {"cgroup_parent": parent, "pids_limit": limits.AGENT_PIDS}, binds, args
