"""k8s/overlays/dev-cluster (the rollout Job inside the dev cluster) agrees with what it runs on: the dev cluster's
API server address (k8s/dev-cluster/up.sh), the image it names (k8s/Dockerfile.offline), Kubernetes 1.20 (no field
newer than 1.20 in the rendered objects we know of), and a hostPath volume the claim really binds to. The generic
checks (schemas of current Kubernetes, restricted pods, configs validate) run on it in test_k8s_manifests.py; the
server-side dry-run against 1.20 and the Job itself run in tests/k8s/test_in_cluster_job.py (k8s tier)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

import yaml
from k8s_kustomize import render

from agentrl.config import RolloutConfig
from agentrl.engine.models import EMBEDDED_DIRNAME
from agentrl.envs.registry import get_env
from agentrl.runner.scheduler import check_time_needs
from agentrl.sandbox.kubernetes.pods import Owner, owner_process_dead

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "k8s" / "overlays" / "dev-cluster"


def _objs() -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(OVERLAY)}


def _config() -> RolloutConfig:
    cm = _objs()[("ConfigMap", "agentrl-config")]
    return RolloutConfig.model_validate(yaml.safe_load(cm["data"]["rollout.yaml"]))


def _container() -> dict:
    return _objs()[("Job", "agentrl-rollout")]["spec"]["template"]["spec"]["containers"][0]


def test_job_has_nothing_kubernetes_1_20_lacks() -> None:
    job = _objs()[("Job", "agentrl-rollout")]
    assert "completionMode" not in job["spec"], "Indexed Jobs need 1.21: the dev cluster's API server drops the field"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1
    assert "suspend" not in job["spec"] and "ttlSecondsAfterFinished" not in job["spec"]
    command = " ".join(_container()["command"])
    assert "JOB_COMPLETION_INDEX" not in command, "only Indexed Jobs set it"


def test_in_cluster_config_points_at_the_api_server_up_sh_starts() -> None:
    up = (REPO / "k8s" / "dev-cluster" / "up.sh").read_text()
    cidr = re.search(r"BRIDGE_CIDR=\$\{AGENTRL_K8S_BRIDGE_CIDR:-([0-9.]+)/\d+\}", up).group(1)
    port = re.search(r"API_PORT=\$\{AGENTRL_K8S_API_PORT:-(\d+)\}", up).group(1)
    env = {e["name"]: e.get("value") for e in _container()["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (cidr, port)


def test_claim_binds_to_the_hostpath_volume() -> None:
    objs = _objs()
    pv, pvc = objs[("PersistentVolume", "agentrl-dev-data")], objs[("PersistentVolumeClaim", "agentrl-data")]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pvc["spec"]["storageClassName"] == pv["spec"]["storageClassName"]
    assert set(pvc["spec"]["accessModes"]) <= set(pv["spec"]["accessModes"])
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain", "the trajectories outlive the claim"
    assert pv["spec"]["hostPath"]["path"].startswith("/")
    assert "namespace" not in pv["metadata"], "PersistentVolumes are cluster-scoped"


def test_job_runs_the_offline_image_with_its_shipped_model() -> None:
    dockerfile = (REPO / "k8s" / "Dockerfile.offline").read_text()
    container = _container()
    assert container["image"] == "agentrl/agentrl:dev-cluster"
    assert container["imagePullPolicy"] == "Never", "there is no registry: the image is loaded into the node"
    script = (REPO / "sandbox_images" / "build-agentrl-image.sh").read_text()
    assert 'IMAGE:-agentrl/agentrl:dev-cluster' in script
    cfg = _config()
    assert cfg.engine.type == "local" and cfg.engine.model == f"/opt/agentrl-model/{EMBEDDED_DIRNAME}"
    assert f"COPY model /opt/agentrl-model/{EMBEDDED_DIRNAME}" in dockerfile
    assert cfg.tasks * cfg.group_size <= 4 and cfg.budgets.max_turns <= 2, "the in-cluster job stays tiny"
    assert cfg.sandbox.backend.kubeconfig is None, "in-cluster config, from the pod's service account"


def test_config_passes_the_checks_agentrl_rollout_makes_before_starting() -> None:
    cfg = _config()
    env = get_env(cfg.env, **cfg.env_options)
    check_time_needs(env, tool_timeout_s=cfg.budgets.tool_timeout_s, finalize_timeout_s=cfg.budgets.finalize_timeout_s)


def test_rollout_pod_shares_the_host_network_to_reach_its_sandboxes() -> None:
    spec = _objs()[("Job", "agentrl-rollout")]["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True


def test_an_owner_in_a_host_network_pod_is_never_judged_by_pid_from_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in (("POD_NAME", "agentrl-rollout-x"), ("POD_NAMESPACE", "agentrl"), ("POD_UID", "u-1")):
        monkeypatch.setenv(key, value)
    owner = Owner.from_env("s1")
    assert owner.host == "pod:agentrl/agentrl-rollout-x" != socket.gethostname()
    # pid 999999 does not exist on this machine: a host-named owner with it would count as dead
    meta = {"annotations": {**owner.annotations(), "agentrl.io/owner-pid": "999999"}}
    assert not owner_process_dead(meta, socket.gethostname())
    assert owner_process_dead({"annotations": {**meta["annotations"], "agentrl.io/owner-host": socket.gethostname()}},
                              socket.gethostname())
    monkeypatch.delenv("POD_UID")
    assert Owner.from_env("s2").host == socket.gethostname(), "outside a pod the host name identifies the owner"


@pytest.mark.parametrize("overlay", ["dev-cluster", "dev-cluster-train"])
def test_every_agentrl_container_of_a_dev_cluster_overlay_runs_the_loaded_image(overlay: str) -> None:
    """The dev cluster has no registry: every agentrl container must name the tag build-agentrl-image.sh loads (a
    bare agentrl/agentrl is ErrImageNeverPull; the base overlay's images: transform does not reach an overlay's own
    resources)."""
    images = []
    for obj in render(REPO / "k8s" / "overlays" / overlay):
        spec = obj.get("spec", {})
        pod = spec.get("template", {}).get("spec", {}) or spec.get("jobTemplate", {}).get("spec", {}).get(
            "template", {}).get("spec", {})
        images += [c["image"] for c in pod.get("initContainers", []) + pod.get("containers", [])]
    agentrl_images = [i for i in images if i.startswith("agentrl/agentrl")]
    assert agentrl_images and set(agentrl_images) == {"agentrl/agentrl:dev-cluster"}, images
