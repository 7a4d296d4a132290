"""Training on 2 CPU ranks inside the dev cluster (k8s/overlays/dev-cluster-train, the `k8s` tier): the overlay
passes a strict server-side dry-run against the dev cluster's Kubernetes 1.20; the engine stand-in Deployment becomes
ready; the two rank Jobs (torchrun nodes 0 and 1, hostNetwork: the dev cluster's pods cannot reach each other) train
1 step; rank 0 alone wrote the run to the hostPath volume: 4 trajectories in 2 whole groups, one metrics row, the
checkpoint of step 1 with both ranks' RNG states, and the weights it handed the stand-in; no sandbox pod is left.

Same preconditions as test_in_cluster_job.py (the dev cluster, the agentrl/agentrl:dev-cluster image rebuilt from
this checkout and loaded, k8s/base applied, agentrl/python:latest loaded, root)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter

import pytest
from test_in_cluster_job import DATA, NAMESPACE, REPO, _kubectl, _sandbox_pods, dev_cluster, image  # noqa: F401

from agentrl.store.jsonl import read_trajectories
from agentrl.types import Status

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1500)]

OVERLAY = REPO / "k8s" / "overlays" / "dev-cluster-train"
JOBS = ("agentrl-train-rank0", "agentrl-train-rank1")
ENGINE = "agentrl-engine-standin"
TIMEOUT_S = 1200


def _status(job: str) -> dict:
    return json.loads(_kubectl("-n", NAMESPACE, "get", "job", job, "-o", "json").stdout).get("status") or {}


def _logs(job: str) -> str:
    return _kubectl("-n", NAMESPACE, "logs", f"job/{job}", "--tail=-1", check=False).stdout


def _wait_for_jobs() -> dict[str, dict]:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        statuses = {job: _status(job) for job in JOBS}
        if any(s.get("failed") for s in statuses.values()) or all(s.get("succeeded") for s in statuses.values()):
            return statuses
        time.sleep(5)
    raise AssertionError(f"the rank Jobs did not finish within {TIMEOUT_S}s; rank 0:\n{_logs(JOBS[0])[-4000:]}")


def _cleanup() -> None:
    for job in JOBS:
        _kubectl("-n", NAMESPACE, "delete", "job", job, "--ignore-not-found", "--wait=false", check=False)
    _kubectl("-n", NAMESPACE, "delete", "deployment", ENGINE, "--ignore-not-found", "--wait=false", check=False)


def test_training_overlay_passes_a_strict_server_side_dry_run(dev_cluster: None) -> None:  # noqa: F811
    out = _kubectl("apply", "--dry-run=server", "--validate=strict", "-k", str(OVERLAY))
    for name in (*JOBS, "agentrl-rollout"):
        assert f"job.batch/{name}" in out.stdout, out.stdout
    assert f"deployment.apps/{ENGINE}" in out.stdout


def test_two_ranks_train_one_step_in_the_cluster(image: None) -> None:  # noqa: F811
    DATA.mkdir(parents=True, exist_ok=True)
    os.chown(DATA, 1000, 1000)
    run = DATA / "train"
    shutil.rmtree(run, ignore_errors=True)
    _cleanup()
    for job in JOBS:
        _kubectl("-n", NAMESPACE, "wait", "--for=delete", f"job/{job}", "--timeout=120s", check=False)
    _kubectl("apply", "-k", str(OVERLAY))
    try:
        _kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{ENGINE}", "--timeout=600s", timeout=620)
        statuses = _wait_for_jobs()
        logs = {job: _logs(job) for job in JOBS}
        for job in JOBS:
            assert statuses[job].get("succeeded") == 1, f"{job} failed: {statuses[job]}\n{logs[job][-4000:]}"
        assert "train: done, 1 steps" in logs[JOBS[0]], logs[JOBS[0]][-2000:]
        assert "train: done" not in logs[JOBS[1]], "only rank 0 reports the job"

        trajectories = read_trajectories(run / "trajectories.jsonl")
        assert len(trajectories) == 4 and len({t.id for t in trajectories}) == 4, "rank 0 writes each one once"
        assert sorted(Counter(t.group_id for t in trajectories).values()) == [2, 2], "groups are whole"
        assert all(t.status != Status.infra_error and t.reward is not None for t in trajectories), \
            [(t.status, t.error) for t in trajectories]
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0]
        checkpoint = run / "checkpoints" / "checkpoint-1"
        assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}
        assert list((run / "weights").glob("step-*")), "no weights were handed to the engine stand-in"

        deadline = time.monotonic() + 60
        while _sandbox_pods() and time.monotonic() < deadline:
            time.sleep(2)
        assert not _sandbox_pods(), "rank 0 left sandbox pods behind"
    finally:
        _cleanup()

