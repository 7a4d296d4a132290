"""What `report_to` costs a training run (issue 35): each tracker's open time, per-step log time and close time.

Replays the metrics rows and trajectories of an existing training run (`agentrl train ... --output-dir RUN`) into
each tracker on its own, in a fresh directory, through the same `TrackerSet.log_step` the training callback calls
(scalars, the three histograms, the trajectory table). Offline, as training logs: W&B offline, local TensorBoard
event files, trackio's and MLflow's local stores.

    python benchmarks/bench_trackers.py RUN [--steps 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a training run's output_dir (metrics.jsonl + trajectories.jsonl)")
    ap.add_argument("--steps", type=int, default=10, help="steps to log (the run's rows, repeated)")
    ap.add_argument("--out", type=Path, help="where the trackers write (default: a temporary directory)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-trackers-"))
    os.environ.setdefault("TRACKIO_DIR", str((out / "trackio").resolve()))  # before trackio is imported
    from agentrl.store import read_trajectories
    from agentrl.trainer.metrics import read_metrics
    from agentrl.trainer.trackers import TRACKERS, TrackerSet

    rows = read_metrics(a.run / "metrics.jsonl")
    by_step: dict[int, list] = {}
    for t in read_trajectories(a.run / "trajectories.jsonl"):
        by_step.setdefault(t.step or 0, []).append(t)
    print(f"{len(rows)} rows x {len(rows[0])} keys, {sum(map(len, by_step.values()))} trajectories; "
          f"logging {a.steps} steps into {out}")
    for name in TRACKERS:
        t0 = time.perf_counter()
        trackers = TrackerSet(out / name, [name], project="bench")
        opened = time.perf_counter() - t0
        times = []
        for step in range(a.steps):
            row = rows[step % len(rows)]
            t1 = time.perf_counter()
            trackers.log_step({**row, "step": step}, by_step.get(row["step"], []))
            times.append(time.perf_counter() - t1)
        t2 = time.perf_counter()
        trackers.close()
        print(f"{name:12s} open {opened:5.2f} s   log_step median {statistics.median(times) * 1e3:6.1f} ms  "
              f"max {max(times) * 1e3:6.1f} ms   close {time.perf_counter() - t2:5.2f} s")


if __name__ == "__main__":
    main()
