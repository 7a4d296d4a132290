"""The cost and the effect of `deterministic` in the local engine, side by side on the embedded SmolLM2-135M-Instruct.

Throughput: N concurrent single-turn requests (~200-token chat prompts, temperature 0.7, seeded) and N 3-turn
trajectories (each turn's input = previous input + reply + ~60 observation tokens), default engine (continuous
batching + prefix cache) vs `deterministic=True` (rows decoded together with batch-invariant kernels, each row prefilled alone, no prefix cache). Batch invariance: N greedy
requests sent together vs each sent alone: how many rows have bit-identical logprobs (and identical ids).

    python benchmarks/bench_determinism.py [--model PATH] [--concurrency 1,8] [--new-tokens 64] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import torch
from bench_engine import multi_turn, prompts, run

from agentrl.engine.local import LocalEngine
from agentrl.engine.models import resolve_model
from agentrl.types import SamplingParams


async def invariance(engine: LocalEngine, batch: list[list[int]], new_tokens: int) -> tuple[int, int, float]:
    """(rows with identical ids, rows with bit-identical logprobs, max |logprob diff|): together vs alone."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    tag = uuid.uuid4().hex
    together = await asyncio.gather(*[engine.generate(p, greedy, session_id=f"{tag}t{i}") for i, p in enumerate(batch)])
    alone = [await engine.generate(p, greedy, session_id=f"{tag}a{i}") for i, p in enumerate(batch)]
    same_ids = sum(a.output_ids == b.output_ids for a, b in zip(together, alone))
    same_lp = sum(a.output_ids == b.output_ids and a.logprobs == b.logprobs for a, b in zip(together, alone))
    diff = max((abs(x - y) for a, b in zip(together, alone) if a.output_ids == b.output_ids
                for x, y in zip(a.logprobs, b.logprobs)), default=0.0)
    return same_ids, same_lp, diff


async def measure(path, batch: list[list[int]], observation: list[int], args: argparse.Namespace,  # type: ignore[no-untyped-def]
                  deterministic: bool) -> dict[str, float]:
    engine = LocalEngine(path, deterministic=deterministic, seed=0)
    try:
        await engine.generate(batch[0][:16], SamplingParams(temperature=0.0, max_new_tokens=2), session_id="warm")
        s_time, s_tokens = await run(engine, batch, args.new_tokens)
        m_time, m_tokens = await multi_turn(engine, batch, observation, args.new_tokens)
        ids, lps, diff = await invariance(engine, batch, args.new_tokens // 2)
    finally:
        await engine.close()
    return {"single": s_tokens / s_time, "multi": m_tokens / m_time, "ids": ids, "lps": lps, "diff": diff}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    observation = tokenizer.encode(" tool output: 3 tests passed, 1 failed: expected 4, got 5." * 4)[:60]
    print(f"model {path.name}, torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}, "
          f"{args.new_tokens} new tokens per turn")
    print("| concurrency | mode | single-turn tok/s | 3-turn tok/s | same ids together vs alone | "
          "bit-identical logprobs | max abs logprob diff |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(c) for c in args.concurrency.split(",")]:
        batch = prompts(tokenizer, n, args.prompt_tokens)
        rows = {mode: await measure(path, batch, observation, args, mode == "deterministic")
                for mode in ("default", "deterministic")}
        for mode, r in rows.items():
            ratio = "" if mode == "default" else (f" ({r['single'] / rows['default']['single']:.2f}x)",
                                                  f" ({r['multi'] / rows['default']['multi']:.2f}x)")
            print(f"| {n} | {mode} | {r['single']:.1f}{ratio[0] if ratio else ''} | "
                  f"{r['multi']:.1f}{ratio[1] if ratio else ''} | {r['ids']}/{n} | {r['lps']}/{n} | {r['diff']:.2e} |")


if __name__ == "__main__":
    asyncio.run(main())
