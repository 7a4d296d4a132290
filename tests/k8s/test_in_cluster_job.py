"""The agent RL job inside the dev cluster (k8s/overlays/dev-cluster, the `k8s` tier): the overlay passes a
server-side dry-run with strict schema validation against the dev cluster's Kubernetes 1.20; the rollout Job (one
`agentrl rollout --sandbox kubernetes` pod, in-cluster config, sandbox pods it creates itself) completes; its
trajectories land on the hostPath volume where the host reads them with agentrl's reader and `agentrl stats`; its
progress is in `kubectl logs`; no sandbox pod is left.

The image agentrl/agentrl:dev-cluster is (re)built from this checkout and loaded into the cluster first
(sandbox_images/build-agentrl-image.sh --load: Docker's layer cache and fixed wheel timestamps make an unchanged
checkout a no-op). Needs the dev cluster (k8s/dev-cluster/up.sh), k8s/base applied and agentrl/python:latest loaded
(make test-k8s does both), root (the hostPath directory is created for uid 1000)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.store.jsonl import read_trajectories
from agentrl.types import Status

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "k8s" / "overlays" / "dev-cluster"
NAMESPACE = "agentrl"  # the overlay's; AGENTRL_K8S_NAMESPACE does not move it
DATA = Path("/var/lib/agentrl-dev-cluster/data")  # k8s/overlays/dev-cluster/data-volume.yaml
CLUSTER_DIR = Path(os.environ.get("AGENTRL_K8S_DIR", Path.home() / ".cache" / "agentrl" / "k8s"))
JOB_TIMEOUT_S = 480


def _problem() -> str | None:
    if not os.environ.get("KUBECONFIG"):
        return "no Kubernetes cluster: set KUBECONFIG (export KUBECONFIG=$(k8s/dev-cluster/up.sh | tail -1))"
    if shutil.which("kubectl") is None:
        return "kubectl is not on PATH"
    if not (CLUSTER_DIR / "docker" / "docker.sock").exists():
        return f"the in-cluster job needs the dev cluster (k8s/dev-cluster/up.sh): no {CLUSTER_DIR}/docker/docker.sock"
    if os.geteuid() != 0:
        return f"creating the hostPath directory {DATA} for uid 1000 needs root"
    return None


@pytest.fixture(scope="module")
def dev_cluster() -> None:
    problem = _problem()
    if problem is not None:
        if os.environ.get("AGENTRL_REQUIRE_K8S") == "1":
            pytest.fail(f"AGENTRL_REQUIRE_K8S=1 but the in-cluster job cannot run: {problem}", pytrace=False)
        pytest.skip(problem)


def _kubectl(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


@pytest.fixture(scope="module")
def image(dev_cluster: None) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run([str(REPO / "sandbox_images" / "build-agentrl-image.sh"), "--load"], env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, f"building/loading agentrl/agentrl:dev-cluster failed:\n{out.stderr[-4000:]}"


def test_overlay_passes_a_strict_server_side_dry_run_on_the_dev_cluster(dev_cluster: None) -> None:
    # kubectl validates against the server's own schema (1.20: unknown fields such as Job.spec.completionMode are
    # errors, where the 1.20 API server itself would silently drop them), then the server admits every object
    out = _kubectl("apply", "--dry-run=server", "--validate=strict", "-k", str(OVERLAY))
    assert "job.batch/agentrl-rollout" in out.stdout and "persistentvolume/agentrl-dev-data" in out.stdout


def _prepare_data_dir() -> Path:
    DATA.mkdir(parents=True, exist_ok=True)
    os.chown(DATA, 1000, 1000)
    rollouts = DATA / "rollouts"
    shutil.rmtree(rollouts, ignore_errors=True)  # what an earlier run left
    return rollouts


def _wait_for_job() -> dict:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = json.loads(_kubectl("-n", NAMESPACE, "get", "job", "agentrl-rollout", "-o", "json").stdout)
        status = job.get("status") or {}
        if status.get("succeeded") or status.get("failed"):
            return status
        time.sleep(3)
    raise AssertionError(f"the Job did not finish within {JOB_TIMEOUT_S}s; logs:\n{_logs()[-4000:]}")


def _logs() -> str:
    return _kubectl("-n", NAMESPACE, "logs", "job/agentrl-rollout", "--tail=-1", check=False).stdout


def _sandbox_pods() -> list[str]:
    out = _kubectl("-n", NAMESPACE, "get", "pods", "-l", "agentrl.io/role=sandbox,agentrl.io/pool=dev-cluster",
                   "-o", "name")
    return out.stdout.split()


def test_rollout_job_in_the_cluster_writes_trajectories_the_host_reads(image: None, tmp_path: Path) -> None:
    rollouts = _prepare_data_dir()
    _kubectl("-n", NAMESPACE, "delete", "job", "agentrl-rollout", "--ignore-not-found", "--wait=true")
    _kubectl("apply", "-k", str(OVERLAY))
    try:
        status = _wait_for_job()
        logs = _logs()
        assert status.get("succeeded") == 1, f"the rollout Job failed: {status}\n{logs[-4000:]}"
        # progress in kubectl logs: the run's header and the summary the container prints at the end
        assert "sandbox kubernetes" in logs and "2 tasks x 2 samples" in logs, logs[-2000:]
        summary = json.loads((rollouts / "summary.json").read_text())
        assert summary, "the summary is empty"

        trajectories = read_trajectories(rollouts / "trajectories.jsonl")
        assert len(trajectories) == 4, [t.status for t in trajectories]
        assert len({t.task_id for t in trajectories}) == 2
        scored = [t for t in trajectories if t.status != Status.infra_error]
        assert len(scored) == 4, [(t.status, t.error) for t in trajectories]  # sandboxes worked in-cluster
        assert all(t.reward is not None for t in scored)
        assert any(t.turns for t in trajectories)

        stats = subprocess.run([sys.executable, "-m", "agentrl.cli", "stats", str(rollouts / "trajectories.jsonl"),
                                "--json", str(tmp_path / "stats.json")], capture_output=True, text=True, timeout=120)
        assert stats.returncode == 0, stats.stderr
        assert json.loads((tmp_path / "stats.json").read_text())

        deadline = time.monotonic() + 60
        while _sandbox_pods() and time.monotonic() < deadline:
            time.sleep(2)
        assert not _sandbox_pods(), "the in-cluster worker left sandbox pods behind"
    finally:
        _kubectl("-n", NAMESPACE, "delete", "job", "agentrl-rollout", "--ignore-not-found", "--wait=false",
                 check=False)
