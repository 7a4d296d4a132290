"""The node side of the fake Kubernetes (`fake_k8s.py`): a fake kubelet that really runs pods as local processes,
and a fake agent-sandbox controller. For tests and benchmarks only.

`FakeKubelet` gives every pod a distinct loopback IP (127.x.y.z, so pods share container ports exactly as on a real
node network), materialises its volumes as directories (emptyDir; configMap and secret volumes from the stored
objects, waiting while they are missing like a real kubelet), runs the init containers to completion and then the
containers, with the pod's own command lines: `$(VAR)` expansion, downward-API env (`metadata.name`, `status.podIP`,
...), mount paths rewritten to the volume directories, `python3` run by this interpreter. It writes pod status as a
kubelet does (scheduled, podIP, init/container states, Ready from a tcpSocket readiness probe, Failed when a
container exits), enforces `activeDeadlineSeconds` (phase Failed, reason DeadlineExceeded), finishes graceful
deletions (SIGTERM, then SIGKILL after the grace period, then removes the object), and reports images in
`bad_images` as ErrImagePull / ImagePullBackOff. Pods not matching `run_selector` become Running without processes
(e.g. the rollout workers' own pods). A pod's containers share the host's pid and network namespaces, so
`shareProcessNamespace` and the relay's abstract socket (named per pod) behave as on a node. Not simulated: images,
users (an agent's `--run-as UID:GID` is dropped: on a shared host a command user's kill(-1) would reach every
process of that uid), read-only mounts, resource limits, networking policy.

`FakeAgentSandboxController` plays the agent-sandbox controller for SandboxClaims: it finds the claim's
SandboxWarmPool and SandboxTemplate, creates a Sandbox (owned by the claim) and its pod from the template (owned by
the Sandbox, named differently and recorded in the Sandbox's `agents.x-k8s.io/pod-name` annotation), and mirrors
the pod's readiness and IPs into the claim's status. It starts pods on demand instead of keeping warm replicas.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import os
import re
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fake_k8s import FakeKubernetes, Obj, labels_match, now_rfc3339, parse_selector

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def _expand(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


class _PodRun:
    def __init__(self, ns: str, name: str, ip: str, root: Path) -> None:
        self.ns, self.name, self.ip, self.root = ns, name, ip, root
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.deadline: asyncio.Task[Any] | None = None
        self.terminating = False
        self.done = False


class FakeKubelet:
    """See the module docstring. `probe_period_s` overrides readiness probe periods (None: the pod's own)."""

    def __init__(self, api: FakeKubernetes, workdir: str | os.PathLike[str], *,
                 run_selector: str = "app.kubernetes.io/managed-by=agentrl", schedule_delay_s: float = 0.0,
                 probe_period_s: float | None = None, bad_images: frozenset[str] = frozenset()) -> None:
        self.api = api
        self.workdir = Path(workdir)
        self.run_selector = parse_selector(run_selector)
        self.schedule_delay_s = schedule_delay_s
        self.probe_period_s = probe_period_s
        self.bad_images = bad_images
        self.runs: dict[tuple[str, str], _PodRun] = {}
        self._ips = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        api.listeners.append(self._on_event)
        api.graceful_pods = True

    # -------------------------------------------------------------- events

    def _spawn(self, coro: Any, run: _PodRun | None = None) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        bucket = run.tasks if run is not None else self._tasks
        bucket.add(task)
        task.add_done_callback(bucket.discard)

    def _on_event(self, resource: str, kind: str, obj: Obj) -> None:
        if resource != "pods":
            return
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        run = self.runs.get(key)
        if kind == "ADDED":
            self._spawn(self._start(obj))
        elif kind == "DELETED":
            if run is not None:
                self._spawn(self._cleanup(run))
        elif run is not None and obj["metadata"].get("deletionTimestamp") and not run.terminating:
            run.terminating = True
            self._spawn(self._terminate(run, int(obj["metadata"].get("deletionGracePeriodSeconds") or 0)))
        elif run is not None and not run.done:
            self._arm_deadline(run, obj)

    def age(self, ns: str, name: str, seconds: float) -> None:
        """Pretend the pod was created and started `seconds` earlier (its activeDeadlineSeconds is re-checked)."""

        def back(o: Obj) -> None:
            o["metadata"]["creationTimestamp"] = now_rfc3339(-seconds - (time.time() - _ts(o["metadata"]
                                                                                          ["creationTimestamp"])))
            if o.get("status", {}).get("startTime"):
                o["status"]["startTime"] = now_rfc3339(-seconds - (time.time() - _ts(o["status"]["startTime"])))

        self.api.mutate("pods", ns, name, back)

    # -------------------------------------------------------------- running a pod

    def _next_ip(self) -> str:
        self._ips += 1
        n = self._ips
        return f"127.{1 + n // 62500}.{(n // 250) % 250}.{1 + n % 250}"

    def _status(self, run: _PodRun, fn: Callable[[Obj], None]) -> Obj | None:
        return self.api.mutate("pods", run.ns, run.name, fn)

    async def _start(self, pod: Obj) -> None:
        await asyncio.sleep(self.schedule_delay_s)
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if self.api.get("pods", ns, name) is None:
            return
        run = _PodRun(ns, name, self._next_ip(), self.workdir / f"{ns}.{name}")
        self.runs[(ns, name)] = run

        def scheduled(o: Obj) -> None:
            o["spec"]["nodeName"] = "fake-node"
            o["status"].update(podIP=run.ip, podIPs=[{"ip": run.ip}], hostIP="127.0.0.1", startTime=now_rfc3339(),
                               conditions=[_cond("PodScheduled", True)])

        pod = self._status(run, scheduled) or pod
        if not labels_match(self.run_selector, pod["metadata"].get("labels") or {}):
            self._status(run, lambda o: o["status"].update(phase="Running", conditions=_conds(True)))
            return
        self._arm_deadline(run, pod)
        run.root.mkdir(parents=True, exist_ok=True)
        if await self._pull_fails(run, pod) or not await self._mount(run, pod):
            return
        for c in pod["spec"].get("initContainers") or []:
            code = await self._run_to_end(run, pod, c)
            if code != 0:
                self._fail(run, f"Init:Error (init container {c['name']} exited with {code})", "Error")
                return
        await self._run_containers(run, pod)

    async def _pull_fails(self, run: _PodRun, pod: Obj) -> bool:
        bad = [c for c in pod["spec"]["containers"] if c.get("image") in self.bad_images]
        if not bad:
            return False
        for reason in ("ErrImagePull", "ImagePullBackOff"):
            self._status(run, lambda o, r=reason: o["status"].update(containerStatuses=[
                {"name": c["name"], "ready": False, "started": False, "image": c.get("image"), "restartCount": 0,
                 "state": {"waiting": {"reason": r, "message": f"pull of {c.get('image')} failed (fake)"}}}
                for c in pod["spec"]["containers"]]))
            await asyncio.sleep(0.1)
        return True

    async def _mount(self, run: _PodRun, pod: Obj) -> bool:
        """Volumes -> directories; waits (like a real kubelet) while a referenced ConfigMap/Secret is missing."""
        for vol in pod["spec"].get("volumes") or []:
            path = run.root / "volumes" / vol["name"]
            path.mkdir(parents=True, exist_ok=True)
            for kind, ref in (("configmaps", vol.get("configMap")), ("secrets", vol.get("secret"))):
                if ref is None:
                    continue
                name = ref.get("name") or ref.get("secretName")
                while (src := self.api.get(kind, run.ns, name)) is None:
                    if self.api.get("pods", run.ns, run.name) is None:
                        return False
                    await asyncio.sleep(0.05)
                files = {key: base64.b64decode(value) if kind == "secrets" else value.encode()
                         for key, value in (src.get("data") or {}).items()}
                files.update({key: base64.b64decode(value) for key, value in (src.get("binaryData") or {}).items()})
                for key, data in files.items():
                    (path / key).write_bytes(data)
                    (path / key).chmod(ref.get("defaultMode", 0o644))
        return True

    def _env(self, run: _PodRun, pod: Obj, c: Obj) -> dict[str, str]:
        fields = {"metadata.name": run.name, "metadata.namespace": run.ns, "metadata.uid": pod["metadata"]["uid"],
                  "status.podIP": run.ip, "spec.nodeName": "fake-node", "status.hostIP": "127.0.0.1"}
        env: dict[str, str] = {}
        for e in c.get("env") or []:
            src = e.get("valueFrom") or {}
            if "fieldRef" in src:
                env[e["name"]] = fields[src["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in src or "configMapKeyRef" in src:
                ref = src.get("secretKeyRef") or src["configMapKeyRef"]
                obj = self.api.get("secrets" if "secretKeyRef" in src else "configmaps", run.ns, ref["name"]) or {}
                raw = (obj.get("data") or {}).get(ref["key"], "")
                env[e["name"]] = base64.b64decode(raw).decode() if "secretKeyRef" in src else raw
            else:
                env[e["name"]] = _expand(e.get("value", ""), env)
        return env

    def _translate(self, run: _PodRun, c: Obj, text: str) -> str:
        for m in sorted(c.get("volumeMounts") or [], key=lambda m: -len(m["mountPath"])):
            mp = m["mountPath"].rstrip("/")
            if text == mp or text.startswith(mp + "/"):
                return str(run.root / "volumes" / m["name"]) + text[len(mp):]
        return text

    async def _exec(self, run: _PodRun, pod: Obj, c: Obj) -> asyncio.subprocess.Process:
        env = self._env(run, pod, c)
        argv = [self._translate(run, c, _expand(a, env)) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not argv:
            raise RuntimeError(f"container {c['name']}: the fake kubelet needs an explicit command")
        if argv[0] in ("python3", "python"):
            argv[0] = sys.executable
        if "--run-as" in argv[:-1]:  # users are not simulated (see the module docstring)
            i = argv.index("--run-as")
            del argv[i:i + 2]
        proc_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    **{k: self._translate(run, c, v) for k, v in env.items()}}
        cwd = self._translate(run, c, c.get("workingDir") or "") or str(run.root)
        log = open(run.root / f"{c['name']}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            return await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=proc_env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()

    async def _run_to_end(self, run: _PodRun, pod: Obj, c: Obj) -> int:
        proc = await self._exec(run, pod, c)
        run.procs[c["name"]] = proc
        return await proc.wait()

    async def _run_containers(self, run: _PodRun, pod: Obj) -> None:
        containers = pod["spec"]["containers"]
        for c in containers:
            run.procs[c["name"]] = await self._exec(run, pod, c)
        started = now_rfc3339()
        self._status(run, lambda o: o["status"].update(phase="Running", conditions=_conds(False), containerStatuses=[
            {"name": c["name"], "ready": False, "started": True, "image": c.get("image"), "restartCount": 0,
             "state": {"running": {"startedAt": started}}} for c in containers]))
        for c in containers:
            self._spawn(self._monitor(run, c["name"]), run)
        await self._probe(run, containers[0])

    async def _probe(self, run: _PodRun, c: Obj) -> None:
        probe = (c.get("readinessProbe") or {}).get("tcpSocket")
        period = self.probe_period_s or float((c.get("readinessProbe") or {}).get("periodSeconds", 10))
        if probe is not None:
            port = probe["port"]
            if isinstance(port, str):
                port = next(p["containerPort"] for p in c.get("ports") or [] if p.get("name") == port)
            while not await _tcp_ok(run.ip, int(port)):
                if run.done or run.terminating:
                    return
                await asyncio.sleep(period)
        if not run.done:
            self._status(run, _mark_ready)

    async def _monitor(self, run: _PodRun, name: str) -> None:
        code = await run.procs[name].wait()
        if not run.done and not run.terminating:
            self._fail(run, f"container {name} exited with {code}", "Error", code)

    def _fail(self, run: _PodRun, message: str, reason: str, code: int = 1) -> None:
        run.done = True
        self._kill(run, signal.SIGKILL)

        def failed(o: Obj) -> None:
            o["status"].update(phase="Failed", reason=reason, message=message, conditions=_conds(False))
            for cs in o["status"].get("containerStatuses") or []:
                cs.update(ready=False, started=False, state={"terminated": {"exitCode": code, "reason": reason}})

        self._status(run, failed)

    def _arm_deadline(self, run: _PodRun, pod: Obj) -> None:
        seconds = pod["spec"].get("activeDeadlineSeconds")
        start = pod.get("status", {}).get("startTime")
        if run.deadline is not None:
            run.deadline.cancel()
        if seconds is None or not start:
            return
        left = _ts(start) + float(seconds) - time.time()

        async def expire() -> None:
            await asyncio.sleep(max(left, 0.0))
            if not run.done and not run.terminating:
                self._fail(run, "Pod was active on the node longer than the specified deadline", "DeadlineExceeded",
                           137)

        run.deadline = asyncio.get_running_loop().create_task(expire())

    # -------------------------------------------------------------- stopping

    def _kill(self, run: _PodRun, sig: int) -> None:
        for proc in run.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)

    async def _terminate(self, run: _PodRun, grace: int) -> None:
        self._kill(run, signal.SIGTERM)
        live = [p.wait() for p in run.procs.values() if p.returncode is None]
        if live:
            _, pending = await asyncio.wait([asyncio.ensure_future(w) for w in live], timeout=max(grace, 0.05))
            if pending:
                self._kill(run, signal.SIGKILL)
        self.api.remove("pods", run.ns, run.name)

    async def _cleanup(self, run: _PodRun) -> None:
        run.done = True
        if run.deadline is not None:
            run.deadline.cancel()
        self._kill(run, signal.SIGKILL)
        for proc in run.procs.values():
            await proc.wait()
        for task in list(run.tasks):
            task.cancel()
        self.runs.pop((run.ns, run.name), None)
        await asyncio.to_thread(shutil.rmtree, run.root, True)

    async def close(self) -> None:
        """Kill every pod's processes (the objects stay)."""
        for run in list(self.runs.values()):
            await self._cleanup(run)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._on_event in self.api.listeners:
            self.api.listeners.remove(self._on_event)


def _cond(kind: str, ok: bool) -> Obj:
    return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now_rfc3339()}


def _conds(ready: bool) -> list[Obj]:
    return [_cond("PodScheduled", True), _cond("Initialized", True), _cond("ContainersReady", ready),
            _cond("Ready", ready)]


def _mark_ready(o: Obj) -> None:
    if o["status"].get("phase") != "Running":
        return
    o["status"]["conditions"] = _conds(True)
    for cs in o["status"].get("containerStatuses") or []:
        cs["ready"] = True


async def _tcp_ok(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


# ------------------------------------------------------------------ agent-sandbox


CLAIMS = "sandboxclaims.extensions.agents.x-k8s.io"
WARMPOOLS = "sandboxwarmpools.extensions.agents.x-k8s.io"
TEMPLATES = "sandboxtemplates.extensions.agents.x-k8s.io"
SANDBOXES = "sandboxes.agents.x-k8s.io"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
CLAIM_LABEL = "agents.x-k8s.io/claim-uid"


class FakeAgentSandboxController:
    """See the module docstring."""

    def __init__(self, api: FakeKubernetes) -> None:
        self.api = api
        api.listeners.append(self._on_event)

    def _on_event(self, resource: str, kind: str, obj: Obj) -> None:
        if resource == CLAIMS and kind == "ADDED":
            self._bind(obj)
        elif resource == "pods" and CLAIM_LABEL in (obj["metadata"].get("labels") or {}):
            self._mirror(obj, deleted=kind == "DELETED")

    def _claim_status(self, ns: str, name: str, ready: bool, reason: str, sandbox: Obj | None = None) -> None:
        def update(o: Obj) -> None:
            o["status"] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": reason,
                                           "message": reason, "lastTransitionTime": now_rfc3339()}],
                           "sandbox": sandbox or {}}

        self.api.mutate(CLAIMS, ns, name, update)

    def _bind(self, claim: Obj) -> None:
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        pool = self.api.get(WARMPOOLS, ns, claim["spec"]["warmPoolRef"]["name"])
        template = pool and self.api.get(TEMPLATES, ns, pool["spec"]["sandboxTemplateRef"]["name"])
        if not template:
            self._claim_status(ns, name, False, "TemplateNotFound")
            return
        sandbox = self.api.create_object(SANDBOXES, ns, {
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name, "ownerReferences": [_owner(claim)]}, "spec": {}})
        pod_name = f"{pool['metadata']['name']}-{secrets.token_hex(4)}"
        self.api.mutate(SANDBOXES, ns, name, lambda o: o["metadata"].setdefault("annotations", {}).update(
            {POD_NAME_ANNOTATION: pod_name}))
        tmpl = template["spec"]["podTemplate"]
        extra = (claim["spec"].get("additionalPodMetadata") or {}).get("labels") or {}
        labels = {**(tmpl.get("metadata", {}).get("labels") or {}), **extra, CLAIM_LABEL: claim["metadata"]["uid"]}
        self.api.create_object("pods", ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": labels, "annotations": tmpl.get("metadata", {}).get(
                "annotations") or {}, "ownerReferences": [_owner(sandbox)]},
            "spec": copy.deepcopy(tmpl["spec"])})

    def _mirror(self, pod: Obj, *, deleted: bool) -> None:
        ns = pod["metadata"]["namespace"]
        uid = pod["metadata"]["labels"][CLAIM_LABEL]
        claim = next((c for c in self.api.objects(CLAIMS, ns) if c["metadata"]["uid"] == uid), None)
        if claim is None:
            return
        conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions") or []}
        ready = not deleted and conds.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")
        ips = [p["ip"] for p in pod.get("status", {}).get("podIPs") or []] if ready else []
        was = {c["type"]: c["status"] for c in claim.get("status", {}).get("conditions") or []}.get("Ready")
        if (was == "True") != ready or not claim.get("status"):
            self._claim_status(ns, claim["metadata"]["name"], ready, "SandboxReady" if ready else "SandboxNotReady",
                               {"name": claim["metadata"]["name"], "podIPs": ips})


def _owner(obj: Obj) -> Obj:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
