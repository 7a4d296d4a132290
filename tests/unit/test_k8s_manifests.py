"""k8s/: every kustomization renders (with the small renderer in k8s_kustomize.py, and identically with `kubectl
kustomize` where kubectl is installed), every rendered object validates against the official schemas of the
supported Kubernetes versions, and the policy holds: restricted pod security everywhere, requests == limits, the
sandbox network policy and RBAC match what the backend emits and does, and the agentrl configs inside the
ConfigMaps validate."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from k8s_kustomize import render

from agentrl.sandbox import SandboxSpec
from agentrl.sandbox.kubernetes.pods import L_ROLE, ROLE
from agentrl.sandbox.kubernetes import KubernetesSandboxConfig

K8S = Path(__file__).resolve().parents[2] / "k8s"
ROOTS = ["base", "rollout", "training", "overlays/kind", "overlays/gvisor", "overlays/agent-sandbox",
         "overlays/dev-cluster", "overlays/training-ranks", "overlays/dev-cluster-train"]
SUPPORTED = ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"]
WORKLOADS = ("Deployment", "Job", "StatefulSet", "DaemonSet", "Pod")


def _key(o: dict) -> tuple[str, str, str]:
    return o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]


@pytest.fixture(scope="module", params=ROOTS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict]]:
    return request.param, render(K8S / request.param)


def _pod_specs(objs: list[dict]) -> list[tuple[dict, dict]]:
    """(metadata, pod spec) of every workload's pod template."""
    out = []
    for o in objs:
        if o["kind"] in WORKLOADS:
            tmpl = o["spec"]["template"] if o["kind"] != "Pod" else o
            out.append((tmpl.get("metadata") or {}, tmpl["spec"]))
    return out


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: the renderer alone is used")
def test_renderer_agrees_with_kubectl(rendered: tuple[str, list[dict]]) -> None:
    root, objs = rendered
    out = subprocess.run(["kubectl", "kustomize", str(K8S / root)], capture_output=True, text=True, check=True)
    theirs = {_key(o): o for o in yaml.safe_load_all(out.stdout) if o}
    assert {_key(o): o for o in objs} == theirs


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_object_validates(rendered: tuple[str, list[dict]], version: str) -> None:
    root, objs = rendered
    assert objs, f"{root} renders nothing"
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{root}: {_key(obj)} is invalid for Kubernetes {version}: {e}") from None


def test_pods_are_restricted_and_guaranteed(rendered: tuple[str, list[dict]]) -> None:
    root, objs = rendered
    for meta, spec in _pod_specs(objs):
        where = f"{root}: {meta.get('labels')}"
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert not any(spec.get(k) for k in ("hostPID", "hostIPC")), where
        # the dev cluster's pods alone (its pods cannot reach each other: k8s/overlays/dev-cluster)
        assert not spec.get("hostNetwork") or root in ("overlays/dev-cluster", "overlays/dev-cluster-train"), where
        assert not any("hostPath" in v for v in spec.get("volumes") or []), where
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}, where
            assert c["resources"]["requests"] == c["resources"]["limits"], f"{where} {c['name']}: requests != limits"


def test_rollout_processes_can_own_and_reach_sandboxes(rendered: tuple[str, list[dict]]) -> None:
    root, objs = rendered
    for meta, spec in _pod_specs(objs):
        if (meta.get("labels") or {}).get(L_ROLE) != "rollout":
            continue
        assert spec["serviceAccountName"] == "agentrl-rollout"
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in
               spec["containers"][0]["env"]}
        assert env["POD_NAME"] == "metadata.name" and env["POD_UID"] == "metadata.uid"
        assert env["POD_NAMESPACE"] == "metadata.namespace"


def test_sandbox_network_policy_matches_the_backend() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render(K8S / "base")}
    iso = objs[("NetworkPolicy", "sandbox-isolation")]["spec"]
    assert iso["podSelector"] == {"matchLabels": {L_ROLE: ROLE}}
    assert set(iso["policyTypes"]) == {"Ingress", "Egress"} and iso["egress"] == []
    (rule,) = iso["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {L_ROLE: "rollout"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": KubernetesSandboxConfig().agent_port}]
    opt_in = objs[("NetworkPolicy", "sandbox-egress-opt-in")]["spec"]
    assert "169.254.0.0/16" in opt_in["egress"][0]["to"][0]["ipBlock"]["except"]
    ns_labels = objs[("Namespace", "agentrl")]["metadata"]["labels"]
    assert ns_labels["pod-security.kubernetes.io/enforce"] == "baseline", "the sandbox agent needs 4 baseline caps"
    assert ns_labels["pod-security.kubernetes.io/warn"] == ns_labels["pod-security.kubernetes.io/audit"] == "restricted"
    quota = objs[("ResourceQuota", "agentrl-sandboxes")]["spec"]
    assert quota["scopes"] == ["Terminating"], "sandbox pods are the ones with activeDeadlineSeconds"
    ratio = objs[("LimitRange", "agentrl-defaults")]["spec"]["limits"][0]["maxLimitRequestRatio"]
    assert ratio == {"cpu": "1", "memory": "1"}


def test_rollout_role_has_no_exec_and_no_wildcards() -> None:
    for root in ROOTS:
        for o in render(K8S / root):
            if o["kind"] != "Role":
                continue
            for rule in o["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], (root, o["metadata"]["name"])
                assert not any("/" in r for r in rule["resources"]), "no subresources (pods/exec, pods/log...)"
                assert not {"update", "deletecollection"} & set(rule["verbs"]) or rule["resources"] != ["pods"]


def _configs(objs: list[dict]) -> dict[str, dict]:
    cms = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "agentrl-config"]
    return {k: yaml.safe_load(v) for cm in cms for k, v in cm["data"].items()}


def test_sandbox_sections_of_the_configs_validate(rendered: tuple[str, list[dict]]) -> None:
    root, objs = rendered
    for name, cfg in _configs(objs).items():
        backend = KubernetesSandboxConfig(**cfg["sandbox"]["backend"])
        SandboxSpec(**cfg["sandbox"]["spec"])
        assert backend.namespace == "agentrl", f"{root}/{name}: sandboxes live next to their owners"
        if root == "overlays/gvisor":
            assert backend.runtime_class == "gvisor"
        if root == "overlays/agent-sandbox":
            assert backend.control_plane == "agent-sandbox"


def _kubernetes_wired() -> bool:
    from agentrl.config import SandboxConfig

    return "kubernetes" in str(SandboxConfig.model_fields["backend"].annotation).lower()


@pytest.mark.skipif(not _kubernetes_wired(), reason="agentrl.config does not accept sandbox.backend.type=kubernetes "
                                                    "yet (KubernetesSandboxConfig is not in SandboxBackendConfig)")
def test_whole_configs_validate(rendered: tuple[str, list[dict]]) -> None:
    from agentrl.config import RolloutConfig, check_ttl_covers_budgets
    from agentrl.trainer.config import TrainConfig

    _, objs = rendered
    for name, cfg in _configs(objs).items():
        config = (TrainConfig if name == "job.yaml" else RolloutConfig).model_validate(cfg)
        check_ttl_covers_budgets(config.budgets, config.sandbox)  # what start-up checks: the TTL covers the budgets


def test_renderer_refuses_what_it_does_not_support(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(ValueError, match="namePrefix"):
        render(tmp_path)


def test_overlay_configs_differ_from_training_only_in_the_backend() -> None:
    base = _configs(render(K8S / "training"))
    for overlay, field in (("overlays/gvisor", "runtime_class"), ("overlays/agent-sandbox", "control_plane")):
        for name, cfg in _configs(render(K8S / overlay)).items():
            other: Any = yaml.safe_load(yaml.safe_dump(base[name]))
            cfg["sandbox"]["backend"].pop(field)
            assert cfg == other, f"{overlay}/{name} drifted from training/{name}"


def test_writable_dirs_become_emptydirs_the_agent_serves() -> None:
    from agentrl.sandbox.kubernetes.pods import PodOptions, pod_spec

    opts = PodOptions(namespace="ns", pool="p", agent_port=8080, agent_configmap="cm", key_secret="key")
    body = pod_spec(SandboxSpec(disk="64m", writable_dirs=("/repo",)), opts, deadline_s=600)
    agent, main = body["containers"]
    for c in (agent, main):  # the agent serves it, the commands use it: the same volume in both containers
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/repo")
        volume = next(v for v in body["volumes"] if v["name"] == mount["name"])
        assert volume["emptyDir"] == {"sizeLimit": "64Mi"} and not mount.get("readOnly")
    assert agent["command"][agent["command"].index("--writable") + 1] == "/repo"
    plain = pod_spec(SandboxSpec(disk="64m"), opts, deadline_s=600)
    assert "--writable" not in plain["containers"][0]["command"]
    assert main["resources"]["limits"]["ephemeral-storage"] != plain["containers"][1]["resources"]["limits"][
        "ephemeral-storage"], "the writable dir's size is part of the storage limit"


def test_trainer_ranks_find_rank_0_through_the_headless_service() -> None:
    from agentrl.trainer.config import TrainConfig

    objs = {(o["kind"], o["metadata"]["name"]): o for o in render(K8S / "overlays/training-ranks")}
    job, svc = objs[("Job", "agentrl-train")], objs[("Service", "agentrl-train-ranks")]
    assert [k for k in objs if k[0] == "Job" and k[1].startswith("agentrl-train")] == [("Job", "agentrl-train")], \
        "the ranked trainer replaces the single one"
    spec, pod = job["spec"], job["spec"]["template"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == svc["metadata"]["name"]
    (c,) = pod["spec"]["containers"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in c["command"] if a.startswith("--") and "=" in a)
    env = {e["name"]: e for e in c["env"]}
    assert flags["master_addr"] == f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
    assert int(flags["master_port"]) == svc["spec"]["ports"][0]["port"]
    assert flags["nnodes"] == "$(NNODES)" and int(env["NNODES"]["value"]) == spec["completions"]
    assert flags["node_rank"] == "$(NODE_RANK)"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert c["command"][-4:] == ["train", "--config", "/config/job.yaml", "--resume"]
    ranks = spec["completions"] * int(flags["nproc_per_node"])
    job_cfg = TrainConfig.model_validate(_configs(list(objs.values()))["job.yaml"])
    per_rank = job_cfg.micro_batch_size or job_cfg.completions_per_step // ranks
    assert job_cfg.completions_per_step % (per_rank * ranks) == 0, "the step's completions do not split over ranks"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == flags["nproc_per_node"]
    claim = objs[("PersistentVolumeClaim", "agentrl-data")]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every rank writes its RNG state into the checkpoint"


def test_dev_cluster_ranks_meet_on_the_node_and_fit_kubernetes_1_20() -> None:
    from agentrl.trainer.config import TrainConfig

    objs = {(o["kind"], o["metadata"]["name"]): o for o in render(K8S / "overlays/dev-cluster-train")}
    ranks = [objs[("Job", f"agentrl-train-rank{r}")] for r in (0, 1)]
    for r, job in enumerate(ranks):
        assert "completionMode" not in job["spec"] and "suspend" not in job["spec"], "1.20 has neither"
        pod = job["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True
        command = pod["containers"][0]["command"][-1]
        assert f"--node_rank={r}" in command and "--nnodes=2" in command and "--master_addr=127.0.0.1" in command
        assert "/health" in command and command.index("/health") < command.index("torchrun")
    assert objs[("Job", "agentrl-rollout")]["spec"]["parallelism"] == 0, "the dev cluster's rollout runs no pod"
    engine = objs[("Deployment", "agentrl-engine-standin")]["spec"]["template"]["spec"]
    assert engine["hostNetwork"] is True
    cfg = TrainConfig.model_validate(yaml.safe_load(objs[("ConfigMap", "agentrl-config")]["data"]["job.yaml"]))
    serve = engine["containers"][0]["command"]
    assert cfg.engine.urls == [f"http://127.0.0.1:{serve[serve.index('--port') + 1]}"]
    assert serve[serve.index("--model") + 1] == cfg.model, "the stand-in serves the checkpoint the ranks train"
    assert cfg.weight_sync == "disk" and str(cfg.output_dir).startswith("/data/")
    assert {m["mountPath"] for m in engine["containers"][0]["volumeMounts"]} >= {"/data"}, "it loads the new weights"
    assert cfg.completions_per_step % (2 * (cfg.micro_batch_size or 1)) == 0
