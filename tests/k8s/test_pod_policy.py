"""Every pod the kubernetes backend can emit (cold, warm, claimed by patch; any SandboxSpec, runtime class, pull
policy and allowed pod template) validates against the official schemas of the supported Kubernetes versions, and
keeps the security defaults. Also: templates that would weaken a sandbox are refused, and the token the init
container writes is the one the backend derives."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.errors import ConfigError
from agentrl.sandbox import SandboxSpec
from agentrl.sandbox.kubernetes.pods import (INIT_SCRIPT, L_EGRESS, L_ROLE, Owner, PodOptions, derive_token,
                                             label_value, pod_spec, spec_hash)
from agentrl.sandbox.kubernetes.pool import PodPool
from agentrl.sandbox.kubernetes import KubernetesSandboxConfig
from fake_k8s import json_patch

SUPPORTED = ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"]

TEMPLATES = [
    None,
    {"spec": {"nodeSelector": {"pool": "sandboxes"}, "tolerations": [{"key": "sandbox", "operator": "Exists",
                                                                       "effect": "NoSchedule"}],
              "priorityClassName": "low", "imagePullSecrets": [{"name": "regcred"}]}},
    {"metadata": {"labels": {"team": "rl"}, "annotations": {"note": "x"}},
     "spec": {"containers": [{"name": "sandbox", "image": "registry.local/task:1", "env": [{"name": "A", "value": "1"}],
                              "resources": {"limits": {"cpu": "2", "memory": "2Gi", "ephemeral-storage": "1Gi"}},
                              "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}],
              "volumes": [{"name": "data", "configMap": {"name": "task-data"}}]}},
]

specs = st.builds(SandboxSpec, cpus=st.sampled_from([0.1, 0.25, 1.0, 2.0, 3.5]),
                  memory=st.sampled_from(["128m", "512m", "1g", "3g", "1536m"]),
                  disk=st.sampled_from(["64m", "256m", "1g"]), network=st.booleans(),
                  ttl_s=st.integers(min_value=10, max_value=86400),
                  image=st.sampled_from(["agentrl/python:latest", "python:3.12-slim"]))


def _pool(template: Any, runtime_class: str | None, pull: str | None, owner: Owner) -> PodPool:
    cfg = KubernetesSandboxConfig(pod_template=template, runtime_class=runtime_class, image_pull_policy=pull)
    opts = PodOptions(namespace=cfg.namespace, pool=cfg.pool, agent_port=cfg.agent_port,
                      agent_configmap="agentrl-agent-0123456789ab", key_secret=cfg.key_secret,
                      runtime_class=runtime_class, image_pull_policy=pull, template=template)
    return PodPool(None, cfg, opts, owner)  # type: ignore[arg-type]  # manifests only: no API calls


def emitted_pods(spec: SandboxSpec, template: Any, runtime_class: str | None, pull: str | None) -> list[dict]:
    """Cold pod, warm pod, and the warm pod after the claim patch (as the API server would apply it)."""
    owner = Owner(session="s1", host="h", pid=1, pid_start="1", pod_name="rollout-0", pod_namespace="agentrl",
                  pod_uid="0f3c2a9e-2f5d-4d43-9e4c-0a1b2c3d4e5f")
    pool = _pool(template, runtime_class, pull, owner)
    cold_body = pod_spec(spec, pool.opts, deadline_s=spec.ttl_s)
    warm_body = pod_spec(spec, pool.opts, deadline_s=spec.ttl_s + 900)
    cold = pool._manifest(spec, cold_body, spec_hash(cold_body), {"agentrl/run-id": "r-1"}, claimed=True)
    warm = pool._manifest(spec, warm_body, spec_hash(warm_body), {}, claimed=False)
    warm_live = {**warm, "metadata": {**warm["metadata"], "resourceVersion": "7"},
                 "status": {"startTime": "2026-01-01T00:00:00Z"}}
    claimed = json_patch(warm_live, pool._claim_patch(warm_live, spec, {"agentrl/run-id": "r-2"}))
    claimed["metadata"].pop("resourceVersion")
    claimed.pop("status")
    return [cold, warm, claimed]


def assert_policy(pod: dict, spec: SandboxSpec) -> None:
    s = pod["spec"]
    assert s["automountServiceAccountToken"] is False and s["enableServiceLinks"] is False
    assert not any(s.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "serviceAccountName"))
    assert s["restartPolicy"] == "Never" and 0 < s["activeDeadlineSeconds"]
    psc = s["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert psc["sysctls"] == [{"name": "kernel.shm_rmid_forced", "value": "1"}], "no SysV memory without a process"
    assert "fsGroup" not in psc, "fsGroup would put the agent in the command group and make the token group-readable"
    containers = s["initContainers"] + s["containers"]
    assert [c["name"] for c in s["containers"]] == ["agentrl-agent", "sandbox"]
    assert s["shareProcessNamespace"] is True  # the agent sees and kills the commands in the other container
    for c in containers:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False  # no_new_privs for all
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"] == c["resources"]["limits"] and {"cpu", "memory"} <= set(
            c["resources"]["limits"])
    # uid separation: the init container writes the token as root with no capability; the agent is root with
    # exactly CHOWN, KILL, SETGID, SETUID and runs every command as 1000:1000 (--run-as)
    init_sc = s["initContainers"][0]["securityContext"]
    assert init_sc["runAsUser"] == 0 and init_sc["capabilities"] == {"drop": ["ALL"]}
    agent, main = s["containers"]
    assert agent["securityContext"]["runAsUser"] == 0 and agent["securityContext"]["runAsNonRoot"] is False
    assert sorted(agent["securityContext"]["capabilities"]["add"]) == ["CHOWN", "KILL", "SETGID", "SETUID"]
    run_as = agent["command"][agent["command"].index("--run-as") + 1]
    # the pod's own uid is the pause container's (pid 1 of the shared pid namespace): never the command user's
    assert run_as == "1000:1000" and psc["runAsUser"] not in (0, 1000) and psc["runAsGroup"] not in (0, 1000)
    relay = agent["command"][agent["command"].index("--relay") + 1]
    # the commands' container runs the relay as root with only what the spawner needs to become the command user
    assert main["command"][:4] == ["python3", "-I", "-S", "-c"] and main["command"][-1] == relay
    assert main["securityContext"]["runAsUser"] == 0 and sorted(main["securityContext"]["capabilities"]["add"]) == [
        "SETGID", "SETUID"]
    # the commands run under agentrl's syscall policy alone (the runtime's would refuse probes first, uncounted);
    # every other container keeps the pod's RuntimeDefault
    assert main["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert not any("seccompProfile" in c["securityContext"] for c in containers if c is not main)
    volumes = {v["name"]: v for v in s["volumes"]}
    assert not any("hostPath" in v for v in s["volumes"])
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/workspace"]["name"]] and "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert mounts["/agentrl"].get("readOnly") is True
    main_mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert main_mounts["/agentrl"].get("readOnly") is True  # the judge's python copy; the token is root's 0400
    assert all(main_mounts[p]["name"] == m["name"] for p, m in mounts.items()), "the same files in both"
    for c in s["containers"]:
        assert not any("secret" in volumes[m["name"]] for m in c["volumeMounts"]), "the key is for the init only"
        assert "exec" not in str(c.get("readinessProbe", {})), "no exec probes either"
    labels = pod["metadata"]["labels"]
    assert labels[L_ROLE] == "sandbox" and (labels.get(L_EGRESS) == "allowed") == spec.network


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, template=st.sampled_from(TEMPLATES), runtime_class=st.sampled_from([None, "gvisor"]),
       pull=st.sampled_from([None, "IfNotPresent", "Never"]))
def test_every_emitted_pod_validates_and_keeps_the_security_defaults(spec: SandboxSpec, template: Any,
                                                                     runtime_class: str | None,
                                                                     pull: str | None) -> None:
    for pod in emitted_pods(spec, template, runtime_class, pull):
        assert_policy(pod, spec)
        for version in (SUPPORTED[0], SUPPORTED[-1]):
            kubernetes_validate.validate(pod, version, strict=True)


@pytest.mark.parametrize("version", SUPPORTED)
def test_default_pods_validate_on_every_supported_version(version: str) -> None:
    for template in TEMPLATES:
        for pod in emitted_pods(SandboxSpec(network=True), template, "gvisor", "IfNotPresent"):
            kubernetes_validate.validate(pod, version, strict=True)


def test_claim_patch_only_lowers_the_deadline_and_is_conditional() -> None:
    spec = SandboxSpec(ttl_s=600)
    pool = _pool(None, None, None, Owner(session="s", host="h", pid=1, pid_start="1"))
    body = pod_spec(spec, pool.opts, deadline_s=600 + 900)
    warm = pool._manifest(spec, body, spec_hash(body), {}, claimed=False)
    warm["metadata"]["resourceVersion"] = "42"
    warm["status"] = {"startTime": "2000-01-01T00:00:00Z"}  # very old: the wanted deadline would be larger
    ops = pool._claim_patch(warm, spec, {})
    assert ops[0] == {"op": "test", "path": "/metadata/labels/agentrl.io~1state", "value": "warm"}
    assert not any(op["path"] == "/spec/activeDeadlineSeconds" for op in ops), "activeDeadlineSeconds may only decrease"
    assert not any(op["path"] == "/metadata/ownerReferences" for op in ops), "no owner pod out of the cluster"
    claimed = json_patch(warm, ops)
    assert claimed["metadata"]["labels"]["agentrl.io/state"] == "claimed"
    assert claimed["metadata"]["annotations"].keys() > warm["metadata"]["annotations"].keys()


async def test_a_claim_survives_the_kubelets_status_writes_but_loses_to_another_claim() -> None:
    """The informer saw the warm pod at resourceVersion 7; the kubelet has since written its status (8). The claim
    still wins: it is conditional on the pod being warm, not on its resourceVersion (at 2,000 pods, claims that
    queued for seconds lost 397 of 2,000 such races and became cold starts). A second claim of the same pod, by a
    runner whose informer has not seen the first, loses with 422 and takes none."""
    from agentrl.sandbox.kubernetes.api import JSON_PATCH, ApiError
    from agentrl.sandbox.kubernetes.pods import L_RUN, pod_spec, spec_hash

    spec = SandboxSpec(ttl_s=600)
    pool = _pool(None, None, None, Owner(session="s", host="h", pid=1, pid_start="1"))
    body = pod_spec(spec, pool.opts, deadline_s=600 + 900)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    seen = pool._manifest(spec, body, spec_hash(body), {}, claimed=False)
    seen["metadata"].update(resourceVersion="7", creationTimestamp=now)
    seen["status"] = {"phase": "Running", "podIP": "10.0.0.1", "startTime": now,
                      "conditions": [{"type": "Ready", "status": "True"}],
                      "containerStatuses": [{"name": c["name"], "state": {"running": {}}} for c in body["containers"]]}
    stored = {"pod": copy.deepcopy(seen)}
    stored["pod"]["metadata"]["resourceVersion"] = "8"
    stored["pod"]["status"]["conditions"].append({"type": "ContainersReady", "status": "True"})

    class Server:
        async def request(self, method: str, path: str, *, body: Any, content_type: str, **kw: Any) -> Any:
            assert method == "PATCH" and content_type == JSON_PATCH, (method, content_type)
            try:
                new = json_patch(stored["pod"], body)
            except Exception as e:  # the fake's Reject: the test op failed
                raise ApiError(422, "Invalid", str(e)) from e
            new["metadata"]["resourceVersion"] = str(int(stored["pod"]["metadata"]["resourceVersion"]) + 1)
            stored["pod"] = new
            return copy.deepcopy(new)

    pool.api = Server()  # type: ignore[assignment]
    pool.informer._replace({"items": [copy.deepcopy(seen)], "metadata": {"resourceVersion": "7"}})
    shash = spec_hash(pod_spec(spec, pool.opts, deadline_s=spec.ttl_s))
    first = await pool._claim(shash, spec, {"agentrl/run-id": "r-1"})
    assert first is not None and first["metadata"]["labels"]["agentrl.io/state"] == "claimed"
    assert pool.counters["claim_conflicts"] == 0
    other = _pool(None, None, None, Owner(session="t", host="h", pid=2, pid_start="2"))
    other.api = Server()  # type: ignore[assignment]
    other.informer._replace({"items": [copy.deepcopy(seen)], "metadata": {"resourceVersion": "7"}})
    assert await other._claim(shash, spec, {"agentrl/run-id": "r-2"}) is None
    assert other.counters["claim_conflicts"] == 1
    assert stored["pod"]["metadata"]["labels"][L_RUN] == first["metadata"]["labels"][L_RUN] == "r-1"


@pytest.mark.parametrize("template, field", [
    ({"spec": {"hostNetwork": True}}, "hostNetwork"),
    ({"spec": {"securityContext": {"runAsUser": 0}}}, "securityContext"),
    ({"spec": {"automountServiceAccountToken": True}}, "automountServiceAccountToken"),
    ({"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}, "hostPath"),
    ({"spec": {"containers": [{"name": "sandbox", "securityContext": {"privileged": True}}]}}, "containers"),
    ({"spec": {"containers": [{"name": "sidecar", "image": "x"}]}}, "containers"),
    ({"spec": {"initContainers": [{"name": "x", "image": "x"}]}}, "initContainers"),
    ({"metadata": {"name": "x"}}, "metadata"),
])
def test_weakening_templates_are_refused(template: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KubernetesSandboxConfig(pod_template=template)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="pool"):
        KubernetesSandboxConfig(pool="Not_A_Label")
    with pytest.raises(ValueError, match="unknown_key|extra"):
        KubernetesSandboxConfig(unknown_key=1)
    with pytest.raises(ConfigError, match="either config or fields"):
        from agentrl.sandbox.kubernetes import KubernetesBackend

        KubernetesBackend(KubernetesSandboxConfig(), namespace="x")


def test_init_script_writes_the_token_the_backend_derives(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "agent.pyz").write_text("# agent\n")
    (tmp_path / "key").write_bytes(b"s3cret-key\n")
    (tmp_path / "dst").mkdir()
    subprocess.run([sys.executable, "-c", INIT_SCRIPT, str(tmp_path / "src" / "agent.pyz"), str(tmp_path / "key"),
                    str(tmp_path / "dst")], env={**os.environ, "POD_NAME": "pool-abc"}, check=True)
    token = (tmp_path / "dst" / "token").read_text()
    assert token == derive_token(b"s3cret-key", "pool-abc") != derive_token(b"s3cret-key", "pool-abd")
    assert (tmp_path / "dst" / "token").stat().st_mode & 0o777 == 0o400
    assert (tmp_path / "dst" / "agent.pyz").read_text() == "# agent\n"


def test_init_script_leaves_an_execute_only_copy_of_the_images_python(tmp_path: Path) -> None:
    """Sandbox.judge_python on kubernetes: /agentrl/judge-python, the image's python3, 0111 (graders started from
    it are non-dumpable from their execve; the agent reports it when the command user cannot read it)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "agent.pyz").write_text("# agent\n")
    (tmp_path / "key").write_bytes(b"k\n")
    (tmp_path / "dst").mkdir()
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))  # not a venv's: the image's own
    subprocess.run([python, "-c", INIT_SCRIPT, str(tmp_path / "src" / "agent.pyz"), str(tmp_path / "key"),
                    str(tmp_path / "dst")], env={**os.environ, "POD_NAME": "p"}, check=True)
    copy = tmp_path / "dst" / "judge-python"
    assert copy.stat().st_mode & 0o7777 == 0o111
    copy.chmod(0o500)
    assert copy.read_bytes() == Path(python).read_bytes()


def test_label_values_are_sanitised() -> None:
    assert label_value("run/with spaces:and-ü") == "run-with-spaces-and"
    assert len(label_value("x" * 100)) == 63


@pytest.mark.parametrize("pod, cause", [
    (None, "deleted"),
    ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}}, "deleted"),
    ({"metadata": {}, "status": {"phase": "Failed", "reason": "Evicted"}}, "evicted"),
    ({"metadata": {}, "status": {"phase": "Failed", "reason": "DeadlineExceeded"}}, "deadline"),
    ({"metadata": {}, "status": {"phase": "Running", "containerStatuses": [{"name": "sandbox", "state": {
        "running": {}}}]}}, None),
    ({"metadata": {}, "status": {"phase": "Failed", "containerStatuses": [{"name": "sandbox", "state": {
        "terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}, "oom"),
    ({"metadata": {}, "status": {"phase": "Failed", "containerStatuses": [{"name": "sandbox", "state": {
        "terminated": {"reason": "Error", "exitCode": 137}}}]}}, "sigkill_unproven"),  # no OOMKilled: no proof
    ({"metadata": {}, "status": {"phase": "Succeeded", "containerStatuses": [{"name": "sandbox", "state": {
        "terminated": {"reason": "Completed", "exitCode": 0}}}]}}, "exited:0"),
    # two containers: the agent's decides; the commands' container ending (OOM) is no death of the sandbox
    ({"metadata": {}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "agentrl-agent", "state": {"running": {}}},
        {"name": "sandbox", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}, None),
    ({"metadata": {}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "agentrl-agent", "state": {"terminated": {"reason": "Error", "exitCode": 137}}},
        {"name": "sandbox", "state": {"running": {}}}]}}, "sigkill_unproven"),
    ({"metadata": {}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "agentrl-agent", "state": {"terminated": {"reason": "Error", "exitCode": 143}}},
        {"name": "sandbox", "state": {"running": {}}}]}}, "signal:15"),
])
def test_pod_death_cause(pod: dict | None, cause: str | None) -> None:
    from agentrl.sandbox.kubernetes.pods import death_cause

    assert death_cause(pod) == cause


@pytest.mark.parametrize("cpus, pod_request", [(0.05, "50m"), (0.1, "100m"), (2.0, "2000m")])
def test_the_pod_cpu_request_is_the_sandbox_cpus(cpus: float, pod_request: str) -> None:
    # the scheduler reserves max(init container, containers): a small init container must not raise tiny sandboxes
    pool = _pool(None, None, None, Owner(session="s", host="h", pid=1, pid_start="1"))
    body = pod_spec(SandboxSpec(cpus=cpus), pool.opts, deadline_s=60)
    init, main = body["initContainers"][0], body["containers"][1]
    assert body["containers"][1]["name"] == "sandbox" and main["resources"]["requests"]["cpu"] == pod_request
    assert int(init["resources"]["requests"]["cpu"].rstrip("m")) <= int(pod_request.rstrip("m"))
