"""benchmarks/bench_scale.py --engine sglang runs end to end on a small size and measures what it claims: the
trajectories went through the real SGLang client to a stand-in server process (its CPU is measured apart), and the
tool outputs made the contexts long."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), "--sizes", "16", "--turns",
                           "3", "--steps", "0", *argv], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_small_run_through_the_sglang_client_with_long_contexts() -> None:
    out = run("--engine", "sglang", "--obs-chars", "1500")
    assert (out["engine"], out["drift_check"]) == ("sglang", "inline")  # inline: the documented default
    r = out["sizes"]["16"]
    assert r["engine"] == "sglang" and r["trajectories"] == 16 and r["tool_calls"] == 16 * 3
    assert r["infra_errors"] == 0 and r["server_cpu_ms_per_tool_call"] > 0
    # 1,500-character outputs are ~500 tokens each: the last turn's context holds two of them and more
    assert r["final_context_tokens_mean"] > 1000
    assert r["cpu_ms_per_tool_call"] > 0
