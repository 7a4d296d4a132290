"""Seconds per GRPO step, synchronous (k=0) vs pipelined (k=1, k=2), same config and seed, runs interleaved.

Runs real training jobs (the demo config by default: embedded SmolLM2-135M-Instruct, code_tests, bubblewrap
sandboxes, CPU) with `pipeline.max_staleness` = each k, `--rounds` times in the order k0 k1 k2 k0 k1 k2 ..., and
prints per k: seconds per step (wall of the training loop / steps), the mean trainer wait, train and sync time,
staleness and IS metrics, and the reward per step; for the synchronous run the ideal overlap bound
max(R, T) / (R + T) (R = rollout, T = train + sync seconds per step). The load average is printed next to them.

    python benchmarks/bench_pipeline.py [--config docs/configs/demo-train.yaml] [--steps 3] [--staleness 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

from agentrl.cli.train import run_train
from agentrl.config import load_config
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def one_run(config: Path, steps: int, k: int, out: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    cfg = load_config(TrainConfig, config, {"steps": steps, "output_dir": str(out), "eval_every": 0,
                                            "pipeline": {"max_staleness": k}, **overrides})
    t0 = time.perf_counter()
    run_train(cfg)
    wall = time.perf_counter() - t0
    rows = read_metrics(out / "metrics.jsonl")
    return {"k": k, "wall_s": round(wall, 1),
            "s_per_step": round(sum(r["time_rollout_s"] + r["time_train_s"] + r["time_sync_s"] for r in rows)
                                / len(rows), 2),
            "rollout_s": round(mean(r["time_rollout_s"] for r in rows), 2),
            "train_s": round(mean(r["time_train_s"] for r in rows), 2),
            "sync_s": round(mean(r["time_sync_s"] for r in rows), 2),
            "engine_idle_s": round(mean(r["engine_idle_s"] for r in rows), 2),
            "staleness_mean": round(mean(r["staleness_mean"] for r in rows), 2),
            "is_ratio_mean": [r["is_ratio_mean"] for r in rows],
            "is_ratio_clipped_frac": [r["is_ratio_clipped_frac"] for r in rows],
            "reward": [round(r["reward_mean"] or 0.0, 3) for r in rows]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "docs" / "configs" / "demo-train.yaml")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--set", type=json.loads, default={}, help="JSON overrides of the config, e.g. '{\"seed\": 1}'")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for k in args.staleness:
                res = one_run(args.config, args.steps, k, Path(d) / f"r{r}-k{k}", args.set)
                res["load_avg"] = [round(x, 1) for x in os.getloadavg()]
                print(json.dumps(res), flush=True)
                results.append(res)
    sync = [x for x in results if x["k"] == 0]
    if sync:
        big_r = mean(x["rollout_s"] for x in sync)
        big_t = mean(x["train_s"] + x["sync_s"] for x in sync)
        print(json.dumps({"bound_max(R,T)/(R+T)": round(max(big_r, big_t) / (big_r + big_t), 3),
                          "R": round(big_r, 2), "T": round(big_t, 2)}))


if __name__ == "__main__":
    main()
