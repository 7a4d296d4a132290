"""GRPO step time on CPU, split into rollout / train / weight sync, for the demo config (docs/configs/demo-train.yaml).

Runs a real training job (embedded SmolLM2-135M-Instruct, easy code_tests tasks, local bubblewrap sandboxes) for
--steps steps into a temp dir and prints, per step and as a mean over the steps after the first (which also pays
for sandbox warm-up), the wall time of the rollout (the runner: generation + tools + tests), the training update
(TRL: logprob forward + backward + optimizer), and the weight sync to the engine, plus model tokens per step.
`--weight-sync disk` measures the SGLang-style path (save full weights, engine reloads from disk) instead of the
in-place copy. The machine's load average is printed: other processes skew CPU numbers.

    python benchmarks/bench_train.py [--config docs/configs/demo-train.yaml] [--steps 3] [--weight-sync local|disk]
                                     [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from statistics import mean

from agentrl.cli.train import run_train
from agentrl.config import load_config
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "demo-train.yaml")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--weight-sync", choices=["local", "disk"], default="local")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        cfg = load_config(TrainConfig, a.config, {"steps": a.steps, "output_dir": tmp, "weight_sync": a.weight_sync,
                                                  "eval_every": 0, "checkpoint_every": 10_000})
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        run_train(cfg)
        wall = time.perf_counter() - t0
        rows = read_metrics(Path(tmp) / "metrics.jsonl")
    steady = rows[1:] or rows
    keys = ("time_rollout_s", "time_train_s", "time_sync_s")
    summary = {k: mean(r[k] for r in steady) for k in keys}
    summary.update(model_tokens_per_step=mean(r["model_tokens"] for r in steady),
                   completion_len_mean=mean(r["completion_len_mean"] for r in steady), wall_s=wall,
                   steps=len(rows), weight_sync=a.weight_sync, load_avg_start=load0, load_avg_end=os.getloadavg()[0],
                   completions_per_step=cfg.completions_per_step)
    print(f"\nGRPO step time, {cfg.batch_size} tasks x {cfg.group_size} samples per step, weight sync "
          f"{a.weight_sync}, CPU threads {os.cpu_count()}, load avg {load0:.1f} -> {summary['load_avg_end']:.1f}\n")
    print("| step | rollout s | train s | sync s | model tokens | reward |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['step']} | {r['time_rollout_s']:.1f} | {r['time_train_s']:.1f} | {r['time_sync_s']:.2f} | "
              f"{r['model_tokens']} | {r['reward_mean']:.3f} |")
    total = sum(summary[k] for k in keys)
    print(f"| mean (steps 1..) | {summary['time_rollout_s']:.1f} ({summary['time_rollout_s'] / total:.0%}) | "
          f"{summary['time_train_s']:.1f} ({summary['time_train_s'] / total:.0%}) | {summary['time_sync_s']:.2f} "
          f"({summary['time_sync_s'] / total:.1%}) | {summary['model_tokens_per_step']:.0f} | |")
    print(f"\nwall {wall:.0f} s for {len(rows)} steps (includes model load, sandbox warm-up, checkpoint-free run)")
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "steps": rows}, indent=1))


if __name__ == "__main__":
    main()
