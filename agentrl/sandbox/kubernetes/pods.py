"""What a sandbox pod is: manifests, labels, ownership, tokens and the rules about pod state. Pure functions, no I/O.

Owns: the pod (and its agent ConfigMap / key Secret) the `kubernetes` backend creates, with the security defaults
enforced whatever the user's pod template says; the labels and annotations that carry pool, state, owner and run;
the per-sandbox bearer token; predicates over pod objects (running, ready, dead, age); and the sweep rule's wiring
(`ownership.py` owns the rule). Does not own API calls (`api.py`), when to create, claim or delete (`pool.py`), or
which pod-template fields a config may set (`template.py`).

One sandbox pod:

    init container agentrl-init (the task image; any image with python3):
        copies agent.pyz (the agent's artifact, artifact.py) from the agent ConfigMap (mounted only here)
        into the `agentrl` emptyDir and writes
        `token` = HMAC-SHA256(namespace key, pod name), 0400; the key Secret is mounted only here
    container agentrl-agent (the agent, its own CPU / memory: backend config agent_cpus / agent_memory_mb):
        python3 -I -S /agentrl/agent.pyz --tcp $(POD_IP):PORT --token-file /agentrl/token --workspace /workspace
        --run-as 1000:1000 --relay agentrl-relay-$(POD_NAME) [--writable D]; /agentrl read-only, /workspace, /tmp
        and each of spec.writable_dirs (volumes writable-N, chowned by the agent) emptyDirs of spec.disk
    container sandbox (the commands, with the spec's CPU / memory / disk; the user's template merges into it):
        python3 -I -S -c RELAY agentrl-relay-$(POD_NAME) (RELAY: the text of agent/relay_program.py), uid 0 with
        only SETUID and SETGID: the relay, which starts the agent's command spawner in this container; the same
        emptyDirs, /agentrl
        read-only (the judge's execute-only python3; the token there is root's, 0400)
    pod: shareProcessNamespace (the agent sees, kills and gets the pids of the commands), no service-account token,
        no service links, restartPolicy Never, activeDeadlineSeconds as TTL, kernel.shm_rmid_forced=1 (below),
        runAsNonRoot with uid/gid 65534 by default (also the pause container's: the pod's pid 1 is no process of the
        command user), seccomp
        RuntimeDefault but for the sandbox container (Unconfined: agentrl's own syscall policy, installed by the
        spawner on every command, is the only one there, so each refused probe is counted), no fsGroup; every
        container: no privilege escalation, read-only root filesystem, all
        capabilities dropped but those named, resources requests == limits

Why two containers: resource separation. The commands' memory, CPU and disk limits are the sandbox container's, so
a command that fills them (memory held by no process, a busy loop, an OOM after lowering its oom_score_adj) cannot
take the agent's: the OOM killer picks inside the container whose limit was hit, and CFS throttles each container on
its own quota. Pids are the pod's (the kubelet's podPidsLimit covers every container): the agent keeps its worker
threads from start-up and kills without forking (the agent's kill.py), so a full pids budget cannot stop it
either. The agent reports `resources_separated` in /health; the relay (the sandbox container's main process) is in
the commands' budget, and if the commands make it die, their later commands fail as the policy's doing. Memory that no
process holds is what can make them do so by accident of timing: the OOM killer, finding nothing to free among the
commands, kills on until the relay is the last process left. kernel.shm_rmid_forced=1 (a namespaced "safe" sysctl)
closes the SysV way to it: a segment goes when its last process detaches, so killing the filler frees its memory.

Why the agent (and the relay) are NOT runAsNonRoot: uid separation. The agent runs as uid 0 with only CHOWN, KILL,
SETGID and SETUID added back (no_new_privs via allowPrivilegeEscalation: false) and starts every command as
1000:1000, so a command can neither signal, ptrace nor read the agent (its environ, fds, memory) nor read the token
(root, 0400, written by the init container, which runs as uid 0 without any capability for that reason). A non-root
agent would share its uid with the commands and all of that would be open to them. No fsGroup: it would add group
1000 to the agent and make volume files group-readable (the token included); the emptyDirs are 0777, and the agent
chowns the workspace root to 1000 (CAP_CHOWN; tools such as git refuse a repository owned by another user). Pod
Security: this needs the "baseline" level (it allows exactly these capabilities), not "restricted".

Why a derived token: no per-pod Secret (no extra API calls, nothing to garbage-collect), and the token is in no API
object, so anyone who may read pods still cannot call a sandbox; a sandbox that reads its own token learns nothing
about another's. Why the agent comes from a ConfigMap, copied by an init container: the pod object stays small
(every watch event carries it) and the task image needs nothing but python3.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentrl.sandbox.agent.protocol import ARTIFACT_NAME
from agentrl.sandbox.artifact import relay_source
from agentrl.sandbox.base import SIGKILL_UNPROVEN, SandboxSpec
from agentrl.sandbox.ownership import OwnerRecord, caller_run_id, owner_gone, sweep_selects, ttl_passed

Obj = dict[str, Any]

# labels (selectable) and annotations (free text)
MANAGED_BY, MANAGED = "app.kubernetes.io/managed-by", "agentrl"
L_ROLE, L_POOL, L_SPEC, L_STATE = "agentrl.io/role", "agentrl.io/pool", "agentrl.io/spec", "agentrl.io/state"
L_CREATOR, L_OWNER, L_OWNER_UID, L_RUN = ("agentrl.io/creator", "agentrl.io/owner", "agentrl.io/owner-uid",
                                          "agentrl.io/run-id")
L_EGRESS = "agentrl.io/egress"
A_HOST, A_PID, A_START, A_POD = ("agentrl.io/owner-host", "agentrl.io/owner-pid", "agentrl.io/owner-start",
                                 "agentrl.io/owner-pod")
A_NONCE, A_LABELS = "agentrl.io/create-nonce", "agentrl.io/caller-labels"
WARM, CLAIMED = "warm", "claimed"
ROLE = "sandbox"
RUN_ID_KEYS = ("agentrl/run-id", "agentrl.run_id", "run_id")  # where a caller's labels may carry the run id

UID = 1000  # the command user
POD_UID = 65534  # the pod's default user, i.e. the pause container's (the pod's pid 1, in the shared pid namespace):
#                  never the command user, or a command could SIGTERM it and so kill every process of the pod
AGENT_DIR, WORKSPACE, TMP, SRC_DIR, KEY_DIR = "/agentrl", "/workspace", "/tmp", "/agentrl-src", "/agentrl-key"
CONTAINER, INIT, AGENT = "sandbox", "agentrl-init", "agentrl-agent"
RELAY_NAME = "agentrl-relay-$(POD_NAME)"  # the relay's abstract socket (the pod's network namespace; named per pod so
#                                          pods sharing a network namespace, e.g. on the test fake, never meet)
DEAD_PHASES = ("Failed", "Succeeded")
FATAL_WAITING = frozenset({"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError",
                           "CreateContainerError", "RunContainerError", "CrashLoopBackOff"})
INIT_SCRIPT = """\
import hashlib, hmac, os, shutil, sys
src, key_file, dst = sys.argv[1:4]
shutil.copyfile(src, os.path.join(dst, "agent.pyz"))
with open(key_file, "rb") as f:
    key = f.read().strip()
token = hmac.new(key, os.environ["POD_NAME"].encode(), hashlib.sha256).hexdigest()
fd = os.open(os.path.join(dst, "token"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
os.write(fd, token.encode())
os.close(fd)
exe = os.path.realpath(sys.executable)  # an execute-only copy for graders (Sandbox.judge_python), within 16Mi
try:
    if sys.prefix == sys.base_prefix and os.path.getsize(exe) < 8 << 20:
        shutil.copyfile(exe, os.path.join(dst, "judge-python"))
        os.chmod(os.path.join(dst, "judge-python"), 0o111)
except OSError as e:
    print("agentrl-init: no execute-only interpreter for graders:", e, file=sys.stderr)
"""


def derive_token(key: bytes, pod_name: str) -> str:
    """The bearer token of the pod called `pod_name` (what INIT_SCRIPT writes inside it)."""
    return hmac.new(key.strip(), pod_name.encode(), hashlib.sha256).hexdigest()


def label_value(text: str) -> str:
    """`text` made a valid label value (<= 63 chars of [A-Za-z0-9._-], alphanumeric at both ends)."""
    clean = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "-" for ch in text)[:63]
    return clean.strip("._-")


def quantity(n_bytes: int) -> str:
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


def cpu_quantity(cpus: float) -> str:
    return f"{max(1, round(cpus * 1000))}m"


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


# ------------------------------------------------------------------ who owns a pod


@dataclass(frozen=True)
class Owner:
    """The process that owns claimed pods: a random session id, its host/pid/start time, and (in-cluster, from the
    downward API env POD_NAME / POD_NAMESPACE / POD_UID) its own pod, which claimed pods reference as owner."""

    session: str
    host: str
    pid: int
    pid_start: str
    pod_name: str | None = None
    pod_namespace: str | None = None
    pod_uid: str | None = None

    @classmethod
    def from_env(cls, session: str) -> Owner:
        """In a pod, `host` names the pod, not the host name: a hostNetwork pod shares the node's host name while its
        pids are its own, so a process on the node must never judge our pid (owner_process_dead) as one of its own."""
        pid = os.getpid()
        name, namespace, uid = (os.environ.get(k) or None for k in ("POD_NAME", "POD_NAMESPACE", "POD_UID"))
        host = f"pod:{namespace or ''}/{name}" if name and uid else socket.gethostname()
        return cls(session=session, host=host, pid=pid, pid_start=OwnerRecord.here().start,
                   pod_name=name, pod_namespace=namespace, pod_uid=uid)

    def labels(self) -> dict[str, str]:
        out = {L_OWNER: self.session}
        if self.pod_uid:
            out[L_OWNER_UID] = label_value(self.pod_uid)
        return out

    def annotations(self) -> dict[str, str]:
        out = {A_HOST: self.host, A_PID: str(self.pid), A_START: self.pid_start}
        if self.pod_name:
            out[A_POD] = f"{self.pod_namespace or ''}/{self.pod_name}"
        return out

    def owner_references(self, namespace: str) -> list[Obj]:
        """A reference to our own pod, only when it is in the sandboxes' namespace (the garbage collector deletes
        dependents of a cross-namespace owner at once)."""
        if not (self.pod_name and self.pod_uid and self.pod_namespace == namespace):
            return []
        return [{"apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.pod_uid,
                 "blockOwnerDeletion": False}]


# ------------------------------------------------------------------ manifests


def agent_configmap(name: str, artifact: bytes, namespace: str) -> Obj:
    """The agent's artifact (agent.pyz, a zip: `binaryData`, base64) in an immutable ConfigMap."""
    import base64

    return {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: MANAGED}},
            "binaryData": {ARTIFACT_NAME: base64.b64encode(artifact).decode()}}


def agent_configmap_name(artifact: bytes) -> str:
    """Named after the artifact's content hash: a changed agent gets a ConfigMap of its own (they are immutable)."""
    return "agentrl-agent-" + hashlib.sha256(artifact).hexdigest()[:12]


def key_secret(name: str, key: str, namespace: str) -> Obj:
    import base64

    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: MANAGED}},
            "data": {"key": base64.b64encode(key.encode()).decode()}}


@dataclass(frozen=True)
class PodOptions:
    """The parts of the backend config the pod manifest depends on."""

    namespace: str
    pool: str
    agent_port: int
    agent_configmap: str
    key_secret: str
    runtime_class: str | None = None
    image_pull_policy: str | None = None
    template: Any = None  # a PodTemplateSpec-like mapping (metadata + spec), see merge_template()
    agent_cpus: float = 0.2  # the agent container's own CPU and memory (requests == limits)
    agent_memory_bytes: int = 256 << 20


# The pod's IPC namespace removes a SysV segment when its last process detaches (a "safe" sysctl: allowed by default
# and by Pod Security "baseline"). Memory no process holds cannot be freed by the OOM killer: a command that filled the
# commands' limit with unattached segments made it kill every process of that container, the relay last.
SHM_RMID_FORCED = {"name": "kernel.shm_rmid_forced", "value": "1"}
AGENT_CAPS = ["CHOWN", "KILL", "SETGID", "SETUID"]  # see "Why the agent (and the relay) are NOT runAsNonRoot" above
RELAY_CAPS = ["SETGID", "SETUID"]  # the spawner it starts becomes the command user


def _restricted(read_only_root: bool = True) -> Obj:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only_root, "privileged": False,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def _as_root(add: list[str]) -> Obj:
    """uid 0 (agent / token writer) with only `add` of the capabilities; everything else as _restricted()."""
    caps: Obj = {"drop": ["ALL"], **({"add": list(add)} if add else {})}
    return {**_restricted(), "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0, "capabilities": caps}


def _resources(cpu: str, memory: str, storage: str) -> Obj:
    values = {"cpu": cpu, "memory": memory, "ephemeral-storage": storage}
    return {"requests": dict(values), "limits": dict(values)}


def pod_spec(spec: SandboxSpec, opts: PodOptions, *, deadline_s: int) -> Obj:
    """The pod spec of one sandbox (before the user's template is merged in)."""
    disk = quantity(spec.disk_bytes)
    storage = quantity((2 + len(spec.writable_dirs)) * spec.disk_bytes + (64 << 20))  # workspace, /tmp, writable
    writable = [(f"writable-{i}", d) for i, d in enumerate(spec.writable_dirs)]  # dirs, logs and the agent dir
    init = {
        "name": INIT, "image": spec.image,
        "command": ["python3", "-c", INIT_SCRIPT, f"{SRC_DIR}/{ARTIFACT_NAME}", f"{KEY_DIR}/key", AGENT_DIR],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": _resources("100m", "64Mi", "16Mi"), "securityContext": _as_root([]),
        "volumeMounts": [{"name": "agent-src", "mountPath": SRC_DIR, "readOnly": True},
                         {"name": "agent-key", "mountPath": KEY_DIR, "readOnly": True},
                         {"name": "agentrl", "mountPath": AGENT_DIR}],
    }
    shared = [{"name": "workspace", "mountPath": WORKSPACE}, {"name": "tmp", "mountPath": TMP},
              *({"name": name, "mountPath": d} for name, d in writable)]  # the agent chowns them
    pod_name = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    agent = {
        "name": AGENT, "image": spec.image,
        "command": ["python3", "-I", "-S", f"{AGENT_DIR}/{ARTIFACT_NAME}", "--tcp", f"$(POD_IP):{opts.agent_port}",
                    "--token-file", f"{AGENT_DIR}/token", "--workspace", WORKSPACE, "--run-as", f"{UID}:{UID}",
                    "--relay", RELAY_NAME, *(["--writable", ":".join(spec.writable_dirs)] if writable else [])],
        "workingDir": WORKSPACE,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}, pod_name,
                {"name": "HOME", "value": WORKSPACE}, {"name": "TMPDIR", "value": TMP}],
        "ports": [{"name": "agent", "containerPort": opts.agent_port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "agent"}, "periodSeconds": 1, "timeoutSeconds": 1,
                           "successThreshold": 1, "failureThreshold": 3},
        "resources": _resources(cpu_quantity(opts.agent_cpus), quantity(opts.agent_memory_bytes), "32Mi"),
        "securityContext": _as_root(AGENT_CAPS),
        "volumeMounts": [{"name": "agentrl", "mountPath": AGENT_DIR, "readOnly": True}, *shared],
    }
    main = {
        "name": CONTAINER, "image": spec.image,
        "command": ["python3", "-I", "-S", "-c", relay_source(), RELAY_NAME],
        "workingDir": WORKSPACE,
        "env": [pod_name, {"name": "HOME", "value": WORKSPACE}, {"name": "TMPDIR", "value": TMP}],
        "resources": _resources(cpu_quantity(spec.cpus), quantity(spec.memory_bytes), storage),
        # the commands run under agentrl's syscall policy (the spawner installs it on each): the runtime's profile
        # underneath would refuse some of its probes first, uncounted
        "securityContext": {**_as_root(RELAY_CAPS), "seccompProfile": {"type": "Unconfined"}},
        "volumeMounts": [{"name": "agentrl", "mountPath": AGENT_DIR, "readOnly": True}, *(dict(m) for m in shared)],
    }
    if opts.image_pull_policy:
        init["imagePullPolicy"] = agent["imagePullPolicy"] = main["imagePullPolicy"] = opts.image_pull_policy
    if spec.cpus < 0.1:  # the init container never asks for more CPU than the sandbox (it would set the pod's request)
        init["resources"] = _resources(cpu_quantity(spec.cpus), "64Mi", "16Mi")
    out: Obj = {
        "automountServiceAccountToken": False, "enableServiceLinks": False, "restartPolicy": "Never",
        "shareProcessNamespace": True,
        "terminationGracePeriodSeconds": 2, "activeDeadlineSeconds": int(deadline_s),
        "securityContext": {"runAsNonRoot": True, "runAsUser": POD_UID, "runAsGroup": POD_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}, "sysctls": [dict(SHM_RMID_FORCED)]},
        "initContainers": [init], "containers": [agent, main],
        "volumes": [{"name": "agentrl", "emptyDir": {"sizeLimit": "16Mi"}},
                    {"name": "workspace", "emptyDir": {"sizeLimit": disk}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": disk}},
                    *({"name": name, "emptyDir": {"sizeLimit": disk}} for name, _ in writable),
                    {"name": "agent-src", "configMap": {"name": opts.agent_configmap, "defaultMode": 0o444}},
                    {"name": "agent-key", "secret": {"secretName": opts.key_secret, "defaultMode": 0o440}}],
    }
    if opts.runtime_class:
        out["runtimeClassName"] = opts.runtime_class
    return merge_template(out, opts.template)


def merge_template(out: Obj, template: Any) -> Obj:
    """User template + our pod spec: user's scheduling fields and extra volumes are kept; for the sandbox container
    the user may set image, pull policy, env, and extra mounts; resources from the template replace the spec's but
    requests are always set equal to limits. The image, pull policy and env also go to the agent's container (the
    agent needs the image's python3, and commands get the agent's environment). Everything security-relevant stays
    ours."""
    if not template:
        return out
    spec = template.get("spec") or {}
    for key, value in spec.items():
        if key not in ("containers", "volumes"):
            out[key] = json.loads(json.dumps(value))
    out["volumes"] = out["volumes"] + list(spec.get("volumes") or [])
    main = next(c for c in out["containers"] if c["name"] == CONTAINER)
    both = [c for c in out["containers"] if c["name"] in (CONTAINER, AGENT)]
    for c in spec.get("containers") or []:
        for key in ("image", "imagePullPolicy", "envFrom"):
            if key in c:
                for target in both:
                    target[key] = c[key]
        if "image" in c:
            out["initContainers"][0]["image"] = c["image"]
        for target in both:
            target["env"] = target["env"] + [e for e in c.get("env") or []
                                             if e.get("name") not in ("POD_IP", "POD_NAME", "HOME")]
        main["volumeMounts"] = main["volumeMounts"] + list(c.get("volumeMounts") or [])
        if c.get("resources"):
            limits = {**(c["resources"].get("requests") or {}), **(c["resources"].get("limits") or {})}
            main["resources"] = {"requests": dict(limits), "limits": dict(limits)}
    return out


def pod_manifest(name: str, spec_body: Obj, *, labels: dict[str, str], annotations: dict[str, str],
                 owner_refs: list[Obj], namespace: str, template: Any = None) -> Obj:
    meta_t = (template or {}).get("metadata") or {}
    metadata: Obj = {"name": name, "namespace": namespace,
                     "labels": {**(meta_t.get("labels") or {}), **labels},
                     "annotations": {**(meta_t.get("annotations") or {}), **annotations}}
    if owner_refs:
        metadata["ownerReferences"] = owner_refs
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec_body}


def spec_hash(spec_body: Obj) -> str:
    """Pods of equal rendered spec (image, limits, agent, TTL...) are interchangeable in the warm pool."""
    body = {k: v for k, v in spec_body.items() if k != "activeDeadlineSeconds"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def base_labels(pool: str, shash: str, spec: SandboxSpec) -> dict[str, str]:
    out = {MANAGED_BY: MANAGED, L_ROLE: ROLE, L_POOL: pool, L_SPEC: shash}
    if spec.network:
        out[L_EGRESS] = "allowed"
    return out


def run_id_of(labels: dict[str, str]) -> str:
    return label_value(caller_run_id(labels, RUN_ID_KEYS))


# ------------------------------------------------------------------ pod state


def _labels(pod: Obj) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


def container_status(pod: Obj, name: str = CONTAINER) -> Obj:
    return next((c for c in pod.get("status", {}).get("containerStatuses") or [] if c.get("name") == name), {})


def is_running(pod: Obj) -> bool:
    """Every container runs (the agent's and the commands') and the pod has an IP (the agent may still be binding
    its port)."""
    st = pod.get("status", {})
    statuses = st.get("containerStatuses") or []
    return (st.get("phase") == "Running" and bool(st.get("podIP")) and bool(statuses)
            and all("running" in (c.get("state") or {}) for c in statuses)
            and not pod["metadata"].get("deletionTimestamp"))


def is_ready(pod: Obj) -> bool:
    """Running and the kubelet's readiness probe reached the agent's port."""
    conds = {c.get("type"): c.get("status") for c in pod.get("status", {}).get("conditions") or []}
    return is_running(pod) and conds.get("Ready") == "True"


def death_reason(pod: Obj | None, deleted: bool) -> str | None:
    """Why this pod will never serve (None while it still may)."""
    if pod is None:
        return "the pod was deleted" if deleted else None
    st = pod.get("status", {})
    if pod["metadata"].get("deletionTimestamp"):
        return "the pod is being deleted"
    if st.get("phase") in DEAD_PHASES:
        return f"the pod is {st['phase']}: {st.get('reason', '')} {st.get('message', '')}".strip()
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        waiting = cs.get("state", {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            return f"container {cs.get('name')}: {waiting['reason']}: {waiting.get('message', '')}".strip()
    return None


def death_cause(pod: Obj | None) -> str | None:
    """The provable cause of a sandbox pod's death, for failure attribution: "deleted" (no such pod, or being
    deleted), "evicted", "deadline" (activeDeadlineSeconds, the TTL), "oom" (the kernel OOM-killed the agent's
    container), SIGKILL_UNPROVEN (SIGKILL without OOMKilled), "signal:<n>" / "exited:<code>" (how the agent ended);
    None while it runs or when unknown. The
    sandbox container's end is not a death: the agent still answers, and the commands fail as the policy's."""
    if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
        return "deleted"
    st = pod.get("status", {})
    if st.get("reason") == "Evicted":
        return "evicted"
    if st.get("reason") == "DeadlineExceeded":
        return "deadline"
    cs = container_status(pod, AGENT) or container_status(pod)  # the agent's (before two containers: the only one)
    term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
    if not term:
        return None
    if term.get("reason") == "OOMKilled":
        return "oom"
    code = int(term.get("exitCode") or 0)
    signum = int(term.get("signal") or (code - 128 if code > 128 else 0))
    if signum == 9:
        # the kubelet's OOMKilled is the runtime's report, which some runtimes never make (gVisor): its absence does
        # not prove that the OOM killer spared the agent, and the kubelet's own kills (deletion, eviction, the
        # deadline) are told above; no record here proves an outside SIGKILL, so none is claimed (attribution calls
        # it infra because the pod's agent is uid- and resource-separated: the policy can reach neither)
        return SIGKILL_UNPROVEN
    return f"signal:{signum}" if signum else f"exited:{code}"


def started_at(pod: Obj) -> float | None:
    """When activeDeadlineSeconds started counting (status.startTime), else the creation time."""
    return parse_time(pod.get("status", {}).get("startTime")) or parse_time(pod["metadata"].get("creationTimestamp"))


def age_s(pod: Obj, now: float) -> float:
    start = started_at(pod)
    return now - start if start is not None else 0.0


def expired(pod: Obj, now: float) -> bool:
    """Past activeDeadlineSeconds (the TTL) from its start (ownership.ttl_passed)."""
    return ttl_passed(started_at(pod), pod.get("spec", {}).get("activeDeadlineSeconds"), now)


def owner_process_dead(meta: Obj, host: str) -> bool:
    """The owner process ran on this host and is gone, or its pid now names another process (ownership.owner_gone)."""
    ann = meta.get("annotations") or {}
    return owner_gone(ann.get(A_HOST), ann.get(A_PID, ""), ann.get(A_START), here=host)


def should_remove(pod: Obj, *, now: float, host: str, live_owner_uids: set[str] | None, run_id: str | None,
                  all_runs: bool) -> bool:
    """The sweep rule for one pod (pure; ownership.sweep_selects): ours and (all runs | of `run_id` | dead | past its
    TTL | claimed by an owner that is gone). Unclaimed warm pods are shared: only their TTL or death removes them."""
    labels = _labels(pod)
    if labels.get(MANAGED_BY) != MANAGED or labels.get(L_ROLE) != ROLE:
        return False
    return sweep_selects(run=labels.get(L_RUN), run_id=run_id, all_runs=all_runs,
                         orphaned=lambda: _orphaned(pod, labels, now=now, host=host, live_owner_uids=live_owner_uids))


def _orphaned(pod: Obj, labels: dict[str, str], *, now: float, host: str, live_owner_uids: set[str] | None) -> bool:
    if pod.get("status", {}).get("phase") in DEAD_PHASES or expired(pod, now):
        return True
    if labels.get(L_STATE) != CLAIMED:
        return False
    uid = labels.get(L_OWNER_UID)
    if uid and live_owner_uids is not None and uid not in live_owner_uids:
        return True
    return owner_process_dead(pod["metadata"], host)


def now() -> float:
    return time.time()
