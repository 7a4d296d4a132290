"""What observing integrity signals costs: `agentrl.runner.integrity.observe()` per trajectory (the only work the
runner adds: the sandbox and the graders already report the facts it reads) and the stored bytes the signals'
inputs add (the visible-test report kept on each code_tests tool result), measured on a stored run.

    python benchmarks/bench_integrity.py RUN_DIR_OR_TRAJECTORIES.jsonl [--repeat 20]

Timed: observe() over every trajectory of the file, `--repeat` times (min and median per trajectory); and the
JSON size of the records with and without the tool results' `tests` field. The exec round trip is unchanged by
construction (no sandbox call is added); repo_fix's run-time tamper audit is part of its grader and is measured by
`benchmarks/bench_repo_fix.py`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from agentrl.runner import integrity
from agentrl.store import encode_trajectory, read_trajectories


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    path = args.path / "trajectories.jsonl" if args.path.is_dir() else args.path
    trajs = read_trajectories(path)
    if not trajs:
        raise SystemExit(f"{path}: no trajectories")
    runs = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        observed = [integrity.observe(tr) for tr in trajs]
        runs.append((time.perf_counter() - t) / len(trajs))
    stripped = [tr.model_copy(update={"turns": [turn.model_copy(update={"tool_results": [
        r.model_copy(update={"tests": None}) for r in turn.tool_results]}) for turn in tr.turns]}) for tr in trajs]
    with_bytes = sum(len(encode_trajectory(tr)) for tr in trajs)
    without_bytes = sum(len(encode_trajectory(tr)) for tr in stripped)
    flagged = sum(bool(o.integrity) for o in observed)
    print(f"{len(trajs)} trajectories from {path}")
    print(f"observe(): min {min(runs) * 1e6:.1f} us, median {statistics.median(runs) * 1e6:.1f} us per trajectory")
    print(f"stored bytes: {with_bytes} with the tool results' test reports, {without_bytes} without "
          f"(+{(with_bytes / without_bytes - 1) * 100:.1f}%)")
    print(f"flagged: {flagged}/{len(trajs)} ({', '.join(f'{k} {v}' for k, v in integrity.counts(observed).items())})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
