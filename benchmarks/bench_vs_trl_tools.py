"""agentrl's scheduler vs TRL 1.16's own tool loop (`GRPOTrainer(environment_factory=...)`), one step's generation
phase, side by side in one process, repetitions interleaved.

Same model, tasks, tool, sampling and budgets on both sides:

- Model: a tiny real Llama (SmolLM2's tokenizer, 2 layers, hidden 64) whose weights are set so that it always answers
  with the same turn: K "thinking" tokens, then one tool call, then end-of-turn. Every layer still runs (attention and
  MLP are computed; their output projections are zeroed), the last token alone picks the next one through the LM
  head, and the margin (~40 logits) makes sampling at temperature 1.0 deterministic. The whole tool call
  `<tool_call>{"name": "wait", ...}</tool_call>` is one added token, so a bigram model can emit it; the chat template
  is Qwen2.5's (ChatML + hermes tool calls, the same special tokens as SmolLM2) because TRL ships a response parser
  for it. The random-weight tiny model of the tests would never call a tool; this one always does.
- Tool: `wait`, sleeping a seeded lognormal latency (sigma 1.5: p99/p50 = 33x). Latency i of rollout (task, j) is
  the same on both sides (j = order in which that task's rollouts were set up). TRL: a method of the
  environment_factory class, `time.sleep` (TRL calls sync and async tools one rollout after another either way).
  agentrl: an Env whose call_tool does `asyncio.sleep`; sandbox-free: the pool is `agentrl.testing.simulated`'s
  in-memory SimulatedPool and the env never touches its sandbox.
- Budgets: `--tools` tool calls per rollout. TRL: max_tool_calling_iterations = tools (tools + 1 generations, the
  last tool call is not executed). agentrl: max_turns = tools + 1, and the (tools+1)-th call returns at once with
  done=True, so both make tools + 1 generations and sleep through the same `tools` latencies.

TRL runs in two configurations (`--trl`): "padded", its default (each turn one left-padded `model.generate` over
every rollout still calling tools), and "cb", its best CPU configuration, `GRPOConfig(
use_transformers_continuous_batching=True)` (each turn one `model.generate_batch`: transformers' continuous-batching
engine with a paged cache, no padding). The tool loop around the generation is TRL's own in both.

Measured per repetition, each row labelled by exactly what its clock covers:

    trl_<mode>_generate_s  TRL's whole `GRPOTrainer._generate(prompts)` of one batch: prompt tokenization, every
                           turn's generation, TRL's tool loop (`_tool_call_loop`: tool calls run one rollout after
                           another) and the response parsing. Timed by a wrapper around the method, driven through
                           `_generate_and_score_completions` (the reward, advantage and logprob computation that
                           follows is NOT timed).
    agentrl_run_s          agentrl's `Scheduler.run` over the same batch until its last group is yielded (what the
                           trainer's rollout_func waits on): rendering, generation (LocalEngine, continuous
                           batching), parsing, tool calls, drift checks and the env's finalize/score.

Warm-up: before the timed repetitions each side runs `--warmup` untimed steps of the same batch (default 1), so no
side pays first-call costs (kernel selection, allocator growth, a paged cache's first allocation) inside a timed row.
Repetitions are interleaved (TRL modes, then agentrl, per repetition). The critical-path bound of a step is the
slowest rollout's own serial time: its latencies plus its generation alone (one rollout through the engine with
zero latency, measured here).

    PYTHONPATH=. python benchmarks/bench_vs_trl_tools.py [--tasks 4 --group 8 --tools 4 --p50 0.05 --reps 3
                                                          --warmup 1 --trl padded cb]
    PYTHONPATH=. python benchmarks/bench_vs_trl_tools.py --quick   # < 1 minute, a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

SIGMA = 1.5  # lognormal shape: p99/p50 = exp(2.326 * 1.5) = 33x
CALL_TEXT = '<tool_call>\n{"name": "wait", "arguments": {}}\n</tool_call>'
THINK_FIRST_ID = 1000  # K consecutive ordinary vocabulary ids used as the "thinking" chain


# ----------------------------------------------------------------------------------------------- shared pieces
class Latencies:
    """The seeded latency table: rollout (task, j) sleeps `table[(task, j)][i]` at its i-th call."""

    def __init__(self, tasks: list[str], group: int, calls: int, p50_s: float, seed: int) -> None:
        rng = random.Random(seed)
        self.table = {(t, j): [p50_s * math.exp(rng.gauss(0.0, SIGMA)) for _ in range(calls)]
                      for t in tasks for j in range(group)}
        self.reset()

    def reset(self) -> None:
        self._next_j: dict[str, int] = defaultdict(int)
        self.slept: list[float] = []

    def assign(self, task: str) -> list[float]:
        """The latencies of the next rollout of `task` set up in this repetition."""
        j = self._next_j[task]
        self._next_j[task] += 1
        return list(self.table[(task, j)])

    def serial_bound_s(self) -> float:
        return max(sum(v) for v in self.table.values())

    def ratio_p99_p50(self) -> float:
        xs = sorted(x for v in self.table.values() for x in v)
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))] / xs[len(xs) // 2]


def build_model(out: Path, think_tokens: int) -> Path:
    """The tiny always-calls-the-tool Llama described in the module docstring; returns its directory."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    from agentrl.engine.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(None))
    tok.add_tokens([AddedToken(CALL_TEXT, normalized=False, special=False)])
    tok.chat_template = qwen2_5_chat_template
    call_id, eos_id = tok.convert_tokens_to_ids(CALL_TEXT), tok.convert_tokens_to_ids("<|im_end|>")
    newline_id = tok.encode("\n", add_special_tokens=False)[-1]
    chain = [newline_id] + list(range(THINK_FIRST_ID, THINK_FIRST_ID + think_tokens)) + [call_id, eos_id]
    hidden = 64
    if len(chain) > hidden:
        raise SystemExit(f"--think {think_tokens} needs more than hidden={hidden} directions; use <= {hidden - 3}")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=eos_id,
                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:  # computed, but they leave the residual stream alone
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        emb.normal_(0.0, 0.02)
        head.normal_(0.0, 0.02)
        for d, (cur, nxt) in enumerate(zip(chain[:-1], chain[1:], strict=True)):
            emb[cur].zero_()
            emb[cur, d] = 1.0  # after RMSNorm: sqrt(hidden) * e_d
            head[nxt].zero_()
            head[nxt, d] = 5.0  # logit 40 for the successor, ~0 for everything else
    model.save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=cfg.pad_token_id, bos_token_id=tok.bos_token_id,
                     do_sample=True).save_pretrained(out)
    return out


def task_ids(n: int) -> list[str]:
    return [f"task-{i:03d}" for i in range(n)]


# ----------------------------------------------------------------------------------------------- agentrl side
def agentrl_env(lat: Latencies) -> Any:
    from agentrl.envs.base import Env, Task
    from agentrl.types import TestOutcome, TestReport, ToolCall, ToolResult, ToolSpec

    class WaitEnv(Env):
        """One tool, `wait`, that sleeps the rollout's next seeded latency; the first call past them ends it."""

        name: ClassVar[str] = "bench-wait"
        action_format = "hermes"
        tools: ClassVar[list[ToolSpec]] = [ToolSpec(name="wait", description="Wait for the slow service.")]

        def __init__(self, tasks: list[str]) -> None:
            super().__init__()
            self._tasks = tasks
            self._left: dict[int, list[float]] = {}

        def tasks(self) -> list[Task]:
            return [Task(id=t, prompt=f"Call the service for {t}.") for t in self._tasks]

        async def setup(self, sandbox: Any, task: Task) -> None:
            self._left[id(sandbox)] = lat.assign(task.id)

        async def call_tool(self, sandbox: Any, call: ToolCall, *, task: Task) -> ToolResult:
            left = self._left[id(sandbox)]
            if not left:
                return ToolResult(call_id=call.id, name=call.name, output="done", done=True)
            dt = left.pop(0)
            await asyncio.sleep(dt)
            lat.slept.append(dt)
            return ToolResult(call_id=call.id, name=call.name, output="ok", exit_code=0, duration_s=dt)

        async def finalize(self, sandbox: Any, task: Task) -> TestReport:
            self._left.pop(id(sandbox), None)
            return TestReport(passed=1, total=1, outcomes=[TestOutcome(name="waited", passed=True)])

    return WaitEnv(lat_tasks(lat))


def lat_tasks(lat: Latencies) -> list[str]:
    return sorted({t for t, _ in lat.table})


class AgentrlSide:
    """The real Rollout + Scheduler + LocalEngine over the sandbox-free WaitEnv."""

    def __init__(self, model_dir: Path, lat: Latencies, args: argparse.Namespace) -> None:
        from transformers import AutoTokenizer

        from agentrl.engine.local import LocalEngine
        from agentrl.runner import Budgets, Rollout, Scheduler, SchedulerConfig
        from agentrl.testing.simulated import SimulatedPool
        from agentrl.tools.render import ChatRenderer
        from agentrl.types import SamplingParams

        self.lat, self.args = lat, args
        tok = AutoTokenizer.from_pretrained(model_dir)
        self.env = agentrl_env(lat)
        self.engine = LocalEngine(model_dir, max_batch_size=args.tasks * args.group, seed=args.seed)
        self.rollout = Rollout(env=self.env, engine=self.engine, renderer=ChatRenderer(tok, self.env.tools),
                               sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=0,
                                                       max_new_tokens=args.max_new_tokens, seed=args.seed),
                               budgets=Budgets(max_turns=args.tools + 1, max_completion_tokens=args.max_completion,
                                               context_window=4096, tool_timeout_s=600))
        self.pool = SimulatedPool(death_p=0.0, max_sandboxes=args.tasks * args.group)
        self._scheduler = lambda group, n: Scheduler(
            self.rollout, self.pool, SchedulerConfig(group_size=group, max_trajectories=n, infra_retries=0,
                                                     max_unscored_frac=1.0))

    async def _run(self, tasks: list[Any], group: int) -> list[Any]:
        sched = self._scheduler(group, len(tasks) * group)
        return [t for g in [g async for g in sched.run(tasks)] for t in g]

    def step(self) -> tuple[float, list[Any]]:
        self.lat.reset()
        t0 = time.perf_counter()
        trajs = asyncio.run(self._run(self.env.tasks(), self.args.group))
        return time.perf_counter() - t0, trajs

    def solo_generation_s(self) -> float:
        """One rollout alone with zero latency: the generation part of a rollout's own serial time."""
        saved = self.lat.table
        self.lat.table = {k: [0.0] * len(v) for k, v in saved.items()}
        self.lat.reset()
        try:
            t0 = time.perf_counter()
            asyncio.run(self._run(self.env.tasks()[:1], 1))
            return time.perf_counter() - t0
        finally:
            self.lat.table = saved


# ----------------------------------------------------------------------------------------------- TRL side
def trl_environment(lat: Latencies) -> type:
    class WaitEnvironment:
        """TRL environment_factory class: one instance per rollout, reset with the dataset row."""

        def __init__(self) -> None:
            self._left: list[float] = []

        def reset(self, **row: Any) -> None:
            self._left = lat.assign(row["task_id"])

        def wait(self) -> str:
            """Wait for the slow service.

            Returns:
                The service's answer.
            """
            if not self._left:
                return "done"
            dt = self._left.pop(0)
            time.sleep(dt)
            lat.slept.append(dt)
            return "ok"

    return WaitEnvironment


def cb_config(args: argparse.Namespace) -> dict[str, Any]:
    """transformers' ContinuousBatchingConfig for TRL's "cb" mode. Its defaults size the paged cache and the batch
    from a GPU's free memory; on CPU that grew this process past 9 GB, so both are sized to the batch: enough blocks
    for every rollout's whole context at once (no eviction), a batch-token budget that holds every decoding row."""
    rollouts = args.tasks * args.group
    page = 256
    return {"page_size": page, "num_blocks": rollouts * (-(-(args.max_completion + 256) // page)) + 8,
            "max_batch_tokens": args.cb_batch_tokens, "max_requests_per_batch": rollouts}


class TrlSide:
    """TRL's GRPOTrainer with its own tool loop; `step()` times `_generate` on one generation batch. `mode`: "padded"
    (TRL's default generation) or "cb" (`use_transformers_continuous_batching=True`)."""

    def __init__(self, model_dir: Path, lat: Latencies, args: argparse.Namespace, out: Path,
                 mode: str = "padded") -> None:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer

        self.lat, self.args = lat, args
        n = args.tasks * args.group
        self.rows = [{"prompt": [{"role": "user", "content": f"Call the service for {t}."}], "task_id": t}
                     for t in lat_tasks(lat) for _ in range(args.group)]
        config = GRPOConfig(output_dir=str(out), per_device_train_batch_size=n, num_generations=args.group,
                            max_completion_length=args.max_completion, max_tool_calling_iterations=args.tools,
                            temperature=1.0, top_p=1.0, top_k=0, use_cpu=True, bf16=False, report_to=[],
                            logging_steps=1, max_steps=1, seed=args.seed, save_strategy="no",
                            use_transformers_continuous_batching=mode == "cb",
                            transformers_continuous_batching_config=cb_config(args) if mode == "cb" else None)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                                   args=config, train_dataset=Dataset.from_list(self.rows),
                                   processing_class=AutoTokenizer.from_pretrained(model_dir),
                                   environment_factory=trl_environment(lat))
        self.generate_s: list[float] = []
        original = self.trainer._generate

        def timed(prompts: list[Any]) -> Any:
            t0 = time.perf_counter()
            try:
                return original(prompts)
            finally:
                self.generate_s.append(time.perf_counter() - t0)

        self.trainer._generate = timed
        self.trainer.model.train()

    def step(self) -> tuple[float, dict[str, Any]]:
        self.lat.reset()
        out = self.trainer._generate_and_score_completions([dict(r) for r in self.rows])
        return self.generate_s[-1], out


# ----------------------------------------------------------------------------------------------- the run
def check_same_work(name: str, lat: Latencies) -> float:
    """Both sides must sleep through exactly the table's latencies (else the comparison is void)."""
    expected = sorted(x for v in lat.table.values() for x in v)
    if sorted(lat.slept) != expected:
        raise SystemExit(f"{name}: slept {len(lat.slept)} latencies, expected {len(expected)}: the model did not "
                         f"call the tool every turn (check the model build)")
    return sum(lat.slept)


def agentrl_turn_check(trajs: list[Any], args: argparse.Namespace) -> None:
    bad = [t for t in trajs if len(t.turns) != args.tools + 1]
    if bad:
        raise SystemExit(f"agentrl: {len(bad)} rollouts with != {args.tools + 1} turns, e.g. status "
                         f"{bad[0].status} turns {len(bad[0].turns)}")


def main(args: argparse.Namespace) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    load0 = os.getloadavg()
    lat = Latencies(task_ids(args.tasks), args.group, args.tools, args.p50, args.seed)
    with tempfile.TemporaryDirectory() as d:
        model_dir = build_model(Path(d) / "model", args.think)
        ours = AgentrlSide(model_dir, lat, args)
        trls = {mode: TrlSide(model_dir, lat, args, Path(d) / f"trl-{mode}", mode) for mode in args.trl}
        solo = min(ours.solo_generation_s() for _ in range(3))  # the ideal: the least it took, alone
        runs: dict[str, list[float]] = {**{f"trl_{m}_generate_s": [] for m in trls}, "agentrl_run_s": []}
        for rep in range(-args.warmup, args.reps):  # negative: the same untimed warm-up steps on every side
            line = []
            for mode, trl in trls.items():
                s, _ = trl.step()
                check_same_work(f"TRL {mode}", lat)
                line.append(f"trl {mode} {s:.2f} s")
                if rep >= 0:
                    runs[f"trl_{mode}_generate_s"].append(s)
            s, trajs = ours.step()
            check_same_work("agentrl", lat)
            agentrl_turn_check(trajs, args)
            if rep >= 0:
                runs["agentrl_run_s"].append(s)
            print(f"{'warm-up' if rep < 0 else 'rep'} {rep}: {'  '.join(line)}  agentrl {s:.2f} s", file=sys.stderr)
        asyncio.run(ours.engine.close())
    tool_bound = lat.serial_bound_s()
    bound = tool_bound + solo
    ours_s = statistics.median(runs["agentrl_run_s"])
    medians = {k: round(statistics.median(v), 2) for k, v in runs.items()}
    return {"config": dict(vars(args)), "rollouts": args.tasks * args.group,
            "latency_p99_over_p50": {"distribution": round(math.exp(2.3263 * SIGMA), 1),
                                     "drawn": round(lat.ratio_p99_p50(), 1)},
            "latency_sum_s": round(sum(x for v in lat.table.values() for x in v), 2),
            "timed": {k: [round(x, 2) for x in v] for k, v in runs.items()}, "median": medians,
            "solo_rollout_generation_s": round(solo, 3), "slowest_rollout_latency_s": round(tool_bound, 3),
            "critical_path_bound_s": round(bound, 3), "agentrl_over_bound": round(ours_s / bound, 3),
            **{f"speedup_vs_trl_{m}": round(medians[f"trl_{m}_generate_s"] / ours_s, 2) for m in trls},
            **{f"trl_{m}_over_bound": round(medians[f"trl_{m}_generate_s"] / bound, 2) for m in trls},
            "load_avg_before": [round(x, 2) for x in load0],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()]}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tools", type=int, default=4, help="tool calls per rollout")
    p.add_argument("--p50", type=float, default=0.05, help="median tool latency, seconds")
    p.add_argument("--think", type=int, default=30, help="tokens the model emits before each tool call")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per side before the timed repetitions")
    p.add_argument("--trl", nargs="+", choices=["padded", "cb"], default=["padded", "cb"],
                   help="TRL generation modes: padded (its default generate) and/or cb "
                        "(use_transformers_continuous_batching)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cb-batch-tokens", type=int, default=1024,
                   help="TRL cb mode: most tokens per continuous-batching forward (prefill chunks + decoding rows)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="per turn")
    p.add_argument("--max-completion", type=int, default=1024, help="per rollout (all turns, tool tokens included)")
    p.add_argument("--quick", action="store_true", help="a < 1 minute smoke run (2 tasks x 4, 2 tools, 1 rep)")
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.group, args.tools, args.p50, args.reps, args.think, args.warmup = 2, 4, 2, 0.1, 1, 8, 0
    return args


if __name__ == "__main__":
    print(json.dumps(main(parse()), indent=1))
