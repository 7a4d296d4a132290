"""benchmarks/bench_vs_trl_tools.py --quick runs end to end (< 1 minute) and measures what it claims.

The script itself exits non-zero unless both sides slept through exactly the seeded latency table (every rollout
called the tool every turn) and every agentrl rollout made tools + 1 turns; here we check the numbers it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_compares_trl_tool_loop_with_agentrl() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_vs_trl_tools.py"), "--quick"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["rollouts"] == 8
    assert out["latency_p99_over_p50"]["distribution"] >= 30
    timed = out["timed"]
    assert set(timed) == {"trl_padded_generate_s", "trl_cb_generate_s", "agentrl_run_s"}  # rows say what is timed
    (ours_s,) = timed["agentrl_run_s"]
    for mode in ("padded", "cb"):  # TRL's default generate and its continuous-batching engine
        (trl_s,) = timed[f"trl_{mode}_generate_s"]
        # TRL runs every rollout's tool calls one after another: its generation phase cannot beat the latencies' sum
        assert trl_s >= out["latency_sum_s"] * 0.99, mode
        # agentrl's rollouts wait concurrently: well under the sum of all latencies, and never under the slowest
        # rollout's own latencies
        assert out["slowest_rollout_latency_s"] * 0.99 <= ours_s < trl_s, mode
    assert out["critical_path_bound_s"] > out["slowest_rollout_latency_s"]
