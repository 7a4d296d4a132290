"""Each backend's wiring of the sweep rule (agentrl/sandbox/ownership.py, tested in test_ownership.py): which of its
records (the local backend's state files, a pod's labels and annotations) the rule reads. The docker backend's
labels: test_docker_backend.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from agentrl.sandbox.kubernetes.pods import (
    A_HOST,
    A_PID,
    A_START,
    CLAIMED,
    L_OWNER_UID,
    L_ROLE,
    L_RUN,
    L_STATE,
    MANAGED,
    MANAGED_BY,
    ROLE,
    WARM,
    should_remove,
)
from agentrl.sandbox.local import LocalBackend
from agentrl.sandbox.ownership import host_id, process_start

NOW = 1_000_000.0


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- local: state.json


def _sandbox(root: Path, sid: str, **over: object) -> None:
    state = {"id": sid, "owner_pid": os.getpid(), "owner_start": process_start(os.getpid()), "owner_host": host_id(),
             "run_id": "r1", "created_at": time.time(), "ttl_s": 3600, **over}
    (root / sid).mkdir(parents=True)
    (root / sid / "state.json").write_text(json.dumps(state))


def test_the_local_sweep_reads_owner_ttl_and_run_from_the_state_file(tmp_path: Path) -> None:
    backend = LocalBackend(state_dir=tmp_path, unsafe_no_isolation=True)
    _sandbox(tmp_path, "live")
    _sandbox(tmp_path, "dead-owner", owner_pid=_dead_pid())
    _sandbox(tmp_path, "reused-pid", owner_start=1)
    _sandbox(tmp_path, "expired", created_at=time.time() - 3601, run_id="r2")
    _sandbox(tmp_path, "other-host", owner_host="elsewhere", owner_pid=_dead_pid())
    _sandbox(tmp_path, "no-times", created_at=None, ttl_s=None)  # unreadable TTL: judged by the owner alone
    assert sorted(backend._victims(None, False)) == ["dead-owner", "expired", "reused-pid"]
    assert sorted(backend._victims("r2", False)) == ["expired"]
    assert len(backend._victims(None, True)) == 6


# ---------------------------------------------------------------- kubernetes: pod labels and annotations


def _pod(*, state: str = CLAIMED, run: str = "r1", pid: int | None = None, start: str | None = None,
         host: str | None = None, owner_uid: str | None = None, phase: str = "Running", age_s: float = 10,
         deadline_s: int = 3600, managed: str = MANAGED) -> dict:
    labels = {MANAGED_BY: managed, L_ROLE: ROLE, L_STATE: state, L_RUN: run}
    if owner_uid:
        labels[L_OWNER_UID] = owner_uid
    pid = os.getpid() if pid is None else pid
    annotations = {A_HOST: host or host_id(), A_PID: str(pid),
                   A_START: str(process_start(pid) or "") if start is None else start}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - age_s))
    return {"metadata": {"labels": labels, "annotations": annotations, "creationTimestamp": started},
            "spec": {"activeDeadlineSeconds": deadline_s}, "status": {"phase": phase, "startTime": started}}


def _rule(pod: dict, run_id: str | None = None, all_runs: bool = False, live: set[str] | None = None) -> bool:
    return should_remove(pod, now=NOW, host=host_id(), live_owner_uids=live, run_id=run_id, all_runs=all_runs)


def test_the_pod_sweep_reads_owner_ttl_and_run_from_labels_and_annotations() -> None:
    assert not _rule(_pod())
    assert _rule(_pod(pid=_dead_pid())) and _rule(_pod(start="1"))  # owner gone, or its pid reused
    assert not _rule(_pod(pid=_dead_pid(), host="pod:ns/elsewhere"))  # another host's owner: the TTL only
    assert _rule(_pod(age_s=3601))  # activeDeadlineSeconds from its start: the TTL
    assert _rule(_pod(phase="Failed"))
    assert _rule(_pod(owner_uid="gone-pod"), live={"another-pod"}) and not _rule(_pod(owner_uid="p"), live={"p"})
    assert not _rule(_pod(state=WARM, pid=_dead_pid()))  # a warm pod is shared: no owner judges it
    assert _rule(_pod(run="r2"), run_id="r2") and not _rule(_pod(phase="Failed"), run_id="r2")
    assert _rule(_pod(), all_runs=True)
    assert not _rule(_pod(managed="someone-else", phase="Failed"), all_runs=True)
