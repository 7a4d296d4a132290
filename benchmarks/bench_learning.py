"""Learning on a multi-turn tool-using task: GRPO of the embedded SmolLM2-135M-Instruct, 3 seeds, each evaluated
before/after on held-out tasks with `agentrl eval` (95% intervals, paired test), plus how the behaviour changed, and
optionally the same run with dynamic sampling for a side-by-side at equal wall time.

`--env tool_calc` (default): 3-digit arithmetic through a ```python block; greedy decoding solves it before training,
so this measures learning the tool-then-answer format under sampling. `--env tool_chain`: a hidden function applied
two times that only the sandbox can evaluate; the base model chains f on to max_turns or stops after one call
(greedy 1/64 held-out), so this measures a new capability at greedy.

Per seed: `agentrl train --config docs/configs/<env>-train.yaml --seed S` (the train split), then
`agentrl eval --checkpoint RUN --baseline smollm2 --config docs/configs/<env>-eval.yaml --seed S` (the eval split:
no operand pair / hidden function of a training task). Reported per seed and mode (sampled at the training
temperature, greedy): mean reward before -> after with 95% bootstrap intervals over tasks, the paired difference
with its 95% interval and p-value (sign-flip permutation test over tasks), and the behaviour on the held-out runs:
tool-call rate (trajectories that ran at least one ```python block), mean model turns, format errors (last turn
without a well-formed `ANSWER: n`, or a block that did not parse), truncation rate (a turn cut at max_new_tokens).
`--dynamic` adds, for the first seed, the same job with `dynamic_sampling.enabled` and compares both runs' training
reward against cumulative wall time, and the held-out score of each run's checkpoint (the longer run is also
evaluated at its checkpoint closest to the shorter run's wall time when `checkpoint_every` allows it).
The machine's load average is recorded: other processes stretch wall times.

    python benchmarks/bench_learning.py [--env tool_calc|tool_chain] [--seeds 0 1 2] [--steps N]
                                        [--out runs/bench_learning] [--dynamic] [--json summary.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENVS = ("tool_calc", "tool_chain")  # each has docs/configs/<env>-train.yaml and <env>-eval.yaml
TRAIN = ROOT / "docs" / "configs" / "tool_calc-train.yaml"
EVAL = ROOT / "docs" / "configs" / "tool_calc-eval.yaml"


def use_env(env: str) -> None:
    """Point TRAIN / EVAL at `env`'s configs."""
    global TRAIN, EVAL
    TRAIN, EVAL = (ROOT / "docs" / "configs" / f"{env}-{kind}.yaml" for kind in ("train", "eval"))


def agentrl(*args: str) -> float:
    """Run `agentrl ...` (this interpreter) and return its wall time; its output goes to our stdout."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agentrl.cli", *args], check=True)
    return time.perf_counter() - t0


def behaviour(path: Path, mode: str) -> dict[str, float]:
    """Tool-call rate, turns, format errors, truncation of one eval side's stored trajectories in `mode`."""
    from agentrl_tool_calc.reward import final_answer

    from agentrl.types import Trajectory

    trajs = [Trajectory.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
    trajs = [t for t in trajs if t.meta.get("eval_mode") == mode and t.reward is not None]
    n = max(len(trajs), 1)
    return {
        "trajectories": len(trajs),
        "tool_call_rate": sum(t.num_tool_calls > 0 for t in trajs) / n,
        "mean_turns": sum(len(t.turns) for t in trajs) / n,
        "format_error_rate": sum(final_answer(t) is None or any(turn.parse_errors for turn in t.turns)
                                 for t in trajs) / n,
        "truncation_rate": sum(any(turn.finish_reason == "length" for turn in t.turns) for t in trajs) / n,
        "pass_rate": sum((t.reward or 0.0) >= 1.0 for t in trajs) / n,
    }


def held_out(run: Path, seed: int, checkpoint: Path | None = None, tag: str = "heldout") -> dict[str, Any]:
    out = run / "eval" / tag
    wall = agentrl("eval", "--checkpoint", str(checkpoint or run), "--baseline", "smollm2", "--config", str(EVAL),
                   "--seed", str(seed), "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    modes = {}
    for mode, m in report["modes"].items():
        d = m["difference"]
        modes[mode] = {"before": m["mean_baseline"], "after": m["mean_candidate"],
                       "ci95_before": m["ci95_baseline"], "ci95_after": m["ci95_candidate"],
                       "difference": d["mean"], "ci95_difference": d["ci95"], "p_value": d["p_value"],
                       "significant": d["significant"], "tasks": d["tasks"],
                       "behaviour_before": behaviour(out / "baseline.jsonl", mode),
                       "behaviour_after": behaviour(out / "candidate.jsonl", mode)}
    return {"eval_wall_s": round(wall, 1), "modes": modes}


def train(run: Path, seed: int, steps: int | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    config = TRAIN
    if extra:
        import yaml

        data = {**yaml.safe_load(TRAIN.read_text()), **extra}
        config = run.parent / f"{run.name}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(data))
    args = ["train", "--config", str(config), "--output-dir", str(run), "--seed", str(seed)]
    if steps is not None:
        args += ["--steps", str(steps)]
    load0 = os.getloadavg()[0]
    wall = agentrl(*args)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    clock, elapsed = [], 0.0
    for r in rows:
        elapsed += r["time_rollout_s"] + r["time_train_s"] + r["time_sync_s"]
        clock.append(round(elapsed, 1))
    keys = ("reward_mean", "pass_rate", "frac_zero_std_groups", "mean_turns", "truncation_rate",
            "groups_dropped_zero_std", "groups_extra")
    return {"train_wall_s": round(wall, 1), "load_start": round(load0, 1), "load_end": round(os.getloadavg()[0], 1),
            "steps": [{"step": r["step"], "elapsed_s": c, **{k: r.get(k) for k in keys}} for r, c in zip(rows, clock)]}


def _ci(ci: list[float] | None) -> str:
    return "-" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def table(results: dict[str, Any]) -> str:
    lines = ["| seed | mode | before [95% CI] | after [95% CI] | difference [95% CI] | p | tool calls | turns | "
             "format errors | truncated | train / eval wall (load) |", "|" + "---|" * 11]
    for seed, r in results["seeds"].items():
        for mode, m in r["eval"]["modes"].items():
            b, a = m["behaviour_before"], m["behaviour_after"]
            lines.append(
                f"| {seed} | {mode} | {m['before']:.3f} {_ci(m['ci95_before'])} | {m['after']:.3f} "
                f"{_ci(m['ci95_after'])} | {m['difference']:+.3f} {_ci(m['ci95_difference'])} | {m['p_value']:.2g} | "
                f"{b['tool_call_rate']:.2f} -> {a['tool_call_rate']:.2f} | {b['mean_turns']:.2f} -> "
                f"{a['mean_turns']:.2f} | {b['format_error_rate']:.2f} -> {a['format_error_rate']:.2f} | "
                f"{b['truncation_rate']:.2f} -> {a['truncation_rate']:.2f} | {r['train']['train_wall_s']:.0f} s / "
                f"{r['eval']['eval_wall_s']:.0f} s (load {r['train']['load_start']}-{r['train']['load_end']}) |")
    return "\n".join(lines)


COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def plot_svg(results: dict[str, Any], path: Path) -> None:
    """A dependency-free SVG: training pass rate per step for each run (left), held-out sampled and greedy score
    before -> after for each seed (right)."""
    runs = [(f"seed {k}", v["train"]["steps"]) for k, v in results["seeds"].items()]
    if "dynamic" in results:
        runs.append((f"seed {results['dynamic']['seed']} + dynamic sampling", results["dynamic"]["on"]["train"]["steps"]))
    n = max((len(steps) for _, steps in runs), default=1)
    w, h, pad = 360, 220, 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w + 3 * pad}" height="{h + 2 * pad + 20 * len(runs)}"'
           ' font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>']

    def axes(x0: int, title: str, xlabel: str) -> None:
        out.append(f'<text x="{x0}" y="{pad - 12}" font-size="12">{title}</text>')
        out.append(f'<line x1="{x0}" y1="{pad + h}" x2="{x0 + w}" y2="{pad + h}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{pad}" x2="{x0}" y2="{pad + h}" stroke="black"/>')
        for v in (0.0, 0.5, 1.0):
            y = pad + h - v * h
            out.append(f'<text x="{x0 - 24}" y="{y + 4}">{v:.1f}</text>')
            out.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + w}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + w // 2 - 30}" y="{pad + h + 28}">{xlabel}</text>')

    axes(pad, "training pass rate per step (trained batch)", "step")
    for i, (label, steps) in enumerate(runs):
        pts = " ".join(f"{pad + s['step'] * w / max(n - 1, 1):.1f},{pad + h - (s['pass_rate'] or 0) * h:.1f}"
                       for s in steps)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS[i % 5]}" stroke-width="2"/>')
        out.append(f'<text x="{pad}" y="{2 * pad + h + 20 * i}" fill="{COLORS[i % 5]}">{label}</text>')
    x0 = 2 * pad + w
    axes(x0, "held-out score: sampled at T=1 (solid), greedy (dashed)", "start            trained")
    for i, r in enumerate(results["seeds"].values()):
        for mode, dash in (("sampled", ""), ("greedy", ' stroke-dasharray="6,4"')):
            m = r["eval"]["modes"].get(mode)
            if m:
                y0, y1 = pad + h - m["before"] * h, pad + h - m["after"] * h
                out.append(f'<line x1="{x0 + 60}" y1="{y0:.1f}" x2="{x0 + w - 60}" y2="{y1:.1f}" '
                           f'stroke="{COLORS[i % 5]}" stroke-width="2"{dash}/>')
    out.append("</svg>")
    path.write_text("\n".join(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=ENVS, default="tool_calc",
                   help="tool_calc: the format benchmark; tool_chain: the skill benchmark (a greedy gain)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, help="overrides the config's steps")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_learning")
    p.add_argument("--dynamic", action="store_true", help="also run the first seed with dynamic sampling")
    p.add_argument("--json", type=Path, help="also write the summary here (default: OUT/summary.json)")
    p.add_argument("--svg", type=Path, help="the plot (default: OUT/learning.svg)")
    a = p.parse_args()
    use_env(a.env)
    if a.out.exists() and any(a.out.iterdir()):
        sys.exit(f"{a.out} is not empty: remove it or pass --out")
    t0 = time.perf_counter()
    results: dict[str, Any] = {"config": str(TRAIN.relative_to(ROOT)), "eval_config": str(EVAL.relative_to(ROOT)),
                               "cpus": os.cpu_count(), "seeds": {}}
    for seed in a.seeds:
        run = a.out / f"seed{seed}"
        results["seeds"][seed] = {"train": train(run, seed, a.steps)}
        results["seeds"][seed]["eval"] = held_out(run, seed)
    if a.dynamic:
        seed = a.seeds[0]
        run = a.out / f"seed{seed}-dynamic"
        results["dynamic"] = {"seed": seed, "off": results["seeds"][seed],
                              "on": {"train": train(run, seed, a.steps, {"dynamic_sampling": {"enabled": True}})}}
        results["dynamic"]["on"]["eval"] = held_out(run, seed)
    results["total_wall_s"] = round(time.perf_counter() - t0, 1)
    path = a.json or a.out / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    plot_svg(results, a.svg or a.out / "learning.svg")
    print(table(results))
    if a.dynamic:
        for label in ("off", "on"):
            steps = results["dynamic"][label]["train"]["steps"]
            print(f"dynamic sampling {label}: " + "  ".join(
                f"{s['elapsed_s']:.0f}s:{s['reward_mean']:.2f}" for s in steps))
    print(f"summary: {path}  (total {results['total_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
