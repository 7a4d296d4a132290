"""The scale harness, small (benchmarks/bench_k8s_scale.py at 96 pods): hollow kubemark nodes on the
dev cluster's real control plane, a simulated agent, and agentrl's own `pods` control plane and runner. What it must
show at any size: every trajectory gets its sandbox, every pod of the run is deleted after it, a dead runner's
claimed pods are all swept by the next one, and the client never drew a 429. The figures themselves are benchmarks
(BENCHMARKS.md), not asserted here.

Run by `make test-k8s-scale`, not in CI's k8s tier: kubemark's fake runtime sometimes ends every container of a hollow
node as it starts (seen on 2 of 10 nodes in a 2,000-pod run, and on both nodes of this test in one CI run: 2,657 warm
pods died before Ready in 10 minutes), and with 2 nodes the fill then never completes. That is the simulator's
fault, not the product's, and a CI gate must not depend on it; the harness's deadline report names it."""

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
@pytest.mark.k8s_scale  # `make test-k8s-scale`, not CI's k8s tier (the module docstring says why)
@pytest.mark.timeout(900)
async def test_the_scale_harness_runs_a_small_fleet_through_the_real_control_plane(real_cluster: Any,
                                                                                  tmp_path: Path) -> None:
    admin = K8S_DIR / "pki" / "admin.kubeconfig"
    if not admin.exists() or Path(os.environ.get("KUBECONFIG", "")).resolve() != admin.resolve():
        problem = "the scale harness runs on the dev cluster (k8s/dev-cluster/up.sh) only"
        if os.environ.get("AGENTRL_REQUIRE_K8S") == "1" and os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    out, log = tmp_path / "scale.json", tmp_path / "scale.log"
    # ~4 minutes when healthy; past --deadline-s the harness prints where every pod stands, then tears down. A deleted
    # pod that kubemark's kubelet is slow to let go is waited for at most --gone-limit-s (it is not a leak)
    cmd = [sys.executable, "benchmarks/bench_k8s_scale.py", "--sizes", str(SIZE), "--max-pending", "100",
           "--turns", "2", "--command-p50-s", "0.2", "--probe-claims", "10", "--probe-every-s", "0.1",
           "--gone-limit-s", "90", "--deadline-s", "600", "--json", str(out)]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True)
        try:
            rc = proc.wait(timeout=840)  # a backstop under the test's 900 s, so that the log below is still shown
        except subprocess.TimeoutExpired:
            proc.terminate()  # the harness tears the fleet down on SIGTERM
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
            rc = None
    text = log.read_text(errors="replace")
    assert rc == 0, f"{' '.join(cmd)} {'hung' if rc is None else f'exited {rc}'}:\n{text[-6000:]}"
    r = json.loads(out.read_text())[0]
    assert r["trajectories"] == SIZE and r["statuses"].get("infra_error", 0) == 0, r["statuses"]
    assert r["claims"] + r["cold"] >= SIZE and r["claims"] >= SIZE // 2, (r["claims"], r["cold"])
    assert r["leaked"] == 0, f"{r['leaked']} pods of the run never deleted {r['leak_wait_s']:.0f} s after close"
    assert r["swept"] == SIZE and r["orphans_undeleted"] == 0, (r["swept"], r["orphans_undeleted"])
    assert r["http_errors"].get("429", 0) == 0, r["http_errors"]
    assert r["probe_claims"] + r["probe_cold"] >= 1
