"""The scale harness, small (benchmarks/bench_k8s_scale.py at 96 pods, CI's version): hollow kubemark nodes on the
dev cluster's real control plane, a simulated agent, and agentrl's own `pods` control plane and runner. What it must
show at any size: every trajectory gets its sandbox, no pod is left after the run, a dead runner's claimed pods are
all swept by the next one, and the client never drew a 429. The figures themselves are benchmarks (BENCHMARKS.md),
not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = Path(os.environ.get("AGENTRL_K8S_DIR", Path.home() / ".cache/agentrl/k8s"))
SIZE = 96


@pytest.mark.k8s
async def test_the_scale_harness_runs_a_small_fleet_through_the_real_control_plane(real_cluster: Any,
                                                                                  tmp_path: Path) -> None:
    admin = K8S_DIR / "pki" / "admin.kubeconfig"
    if not admin.exists() or Path(os.environ.get("KUBECONFIG", "")).resolve() != admin.resolve():
        problem = "the scale harness runs on the dev cluster (k8s/dev-cluster/up.sh) only"
        if os.environ.get("AGENTRL_REQUIRE_K8S") == "1" and os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "benchmarks/bench_k8s_scale.py", "--sizes", str(SIZE), "--max-pending", "100",
           "--turns", "2", "--command-p50-s", "0.2", "--probe-claims", "10", "--probe-every-s", "0.1",
           "--json", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{' '.join(cmd)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    r = json.loads(out.read_text())[0]
    assert r["trajectories"] == SIZE and r["statuses"].get("infra_error", 0) == 0, r["statuses"]
    assert r["claims"] + r["cold"] >= SIZE and r["claims"] >= SIZE // 2, (r["claims"], r["cold"])
    assert r["leaked"] == 0, f"{r['leaked']} pods of the run left {r['leak_wait_s']:.0f} s after close"
    assert r["swept"] == SIZE and r["orphans_left"] == 0, (r["swept"], r["orphans_left"])
    assert r["http_errors"].get("429", 0) == 0, r["http_errors"]
    assert r["probe_claims"] + r["probe_cold"] >= 1
