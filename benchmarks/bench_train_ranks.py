"""1 vs 2 training processes on CPU: per-step time and, in deterministic mode, whether the results are identical.

Runs `agentrl train --deterministic` on the demo config (docs/configs/demo-train.yaml; 2 steps, turns of at most
--max-new-tokens tokens, truncated turns still trained on, no evaluation or snapshots) once on 1 process and once
with `--nproc 2` (torchrun, gloo), each with one intra-op thread per process, into a temp dir (or --out). Prints, per
run, the wall time of the whole command, the per-step rollout / train / weight-sync times from metrics.jsonl, and
then the comparison: per-step reward (exact), loss (difference), and the stored trajectories (ids, token ids, masks,
rewards exact; largest logprob difference). `--compare DIR1 DIR2` only compares two existing run dirs. The machine's
load average is printed: other processes skew CPU numbers.

    python benchmarks/bench_train_ranks.py [--steps 2] [--max-new-tokens 48] [--out DIR] [--json out.json]
    python benchmarks/bench_train_ranks.py --compare RUN_1PROC RUN_2PROC
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from agentrl.store import read_trajectories
from agentrl.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def job_config(out: Path, steps: int, max_new_tokens: int) -> Path:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docs" / "configs" / "demo-train.yaml").read_text())
    data.update(steps=steps, eval_every=0, snapshot={"every": 0}, micro_batch_size=2, output_dir=str(out),
                deterministic=True, group_size=4, batch_size=2, mask_truncated_completions=False)
    data["sampling"] = {**data.get("sampling", {}), "max_new_tokens": max_new_tokens}
    data["budgets"] = {**data.get("budgets", {}), "max_turns": 2, "max_completion_tokens": 2 * max_new_tokens}
    data["sandbox"] = {**data.get("sandbox", {}), "warm": 2, "max_sandboxes": 8}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(config: Path, nproc: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "envs" / "code_tests"),
                                                                 env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--config", str(config)] + \
        (["--nproc", str(nproc)] if nproc > 1 else [])
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return time.perf_counter() - t0


def steps_table(run_dir: Path) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in ("step", "reward_mean", "loss", "time_rollout_s", "time_train_s", "time_sync_s")}
            for r in read_metrics(run_dir / "metrics.jsonl")]


def compare(one: Path, two: Path) -> dict[str, Any]:
    m1, m2 = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    t1, t2 = read_trajectories(one / "trajectories.jsonl"), read_trajectories(two / "trajectories.jsonl")
    same_tokens = len(t1) == len(t2) and all(
        (a.id, a.prompt_ids, a.completion_ids, a.env_mask, a.reward) == (b.id, b.prompt_ids, b.completion_ids,
                                                                         b.env_mask, b.reward)
        for a, b in zip(t1, t2, strict=False))
    logprob_diff = max((abs(x - y) for a, b in zip(t1, t2, strict=False)
                        for x, y in zip(a.logprobs, b.logprobs, strict=False)), default=0.0)
    return {
        "rewards_equal": [a["reward_mean"] for a in m1] == [b["reward_mean"] for b in m2],
        "loss_abs_diff": [abs((a["loss"] or 0.0) - (b["loss"] or 0.0)) for a, b in zip(m1, m2, strict=False)],
        "losses": [[a["loss"], b["loss"]] for a, b in zip(m1, m2, strict=False)],
        "trajectories": [len(t1), len(t2)],
        "trajectories_identical": same_tokens,
        "logprob_max_abs_diff": logprob_diff,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, help="keep the runs here (default: a temp dir)")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("RUN_1PROC", "RUN_2PROC"))
    p.add_argument("--json", type=Path, help="also write the numbers here")
    a = p.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    result: dict[str, Any] = {}
    if a.compare:
        dirs = {1: a.compare[0], 2: a.compare[1]}
    else:
        root = a.out or Path(tempfile.mkdtemp(prefix="bench-train-ranks-"))
        root.mkdir(parents=True, exist_ok=True)
        dirs = {n: root / f"nproc{n}" for n in (1, 2)}
        for n, d in dirs.items():
            result[f"wall_s_nproc{n}"] = round(run(job_config(d, a.steps, a.max_new_tokens), n), 1)
    for n, d in dirs.items():
        result[f"steps_nproc{n}"] = steps_table(d)
    result["comparison"] = compare(dirs[1], dirs[2])
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
