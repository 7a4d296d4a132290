"""Throughput of the local engine: 1 vs N concurrent trajectories on the embedded SmolLM2-135M-Instruct.

Each trajectory sends one ~200-token chat prompt (distinct per trajectory) and samples up to 128 new tokens
(temperature 0.7, seeded). A reference row runs transformers' own `generate()` on one sequence. Prints a markdown
table: wall time, generated tokens, tokens/s, and the speed-up over one trajectory.

    python benchmarks/bench_engine.py [--model PATH] [--concurrency 1,4,16] [--new-tokens 128] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from agentrl.engine.local import LocalEngine
from agentrl.engine.models import resolve_model
from agentrl.types import SamplingParams

TOPICS = ["rivers", "volcanoes", "compilers", "bees", "glaciers", "trains", "chess", "bread", "comets", "forests",
          "bridges", "whales", "deserts", "clocks", "violins", "satellites"]


def prompts(tokenizer, count: int, target_tokens: int) -> list[list[int]]:
    out = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        filler = f" Background: {topic} have been studied for centuries by people around the world."
        text = f"Write a long, detailed essay about {topic}."
        ids: list[int] = []
        while len(ids) < target_tokens:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_dict=False)
            text += filler
        out.append(ids)
    return out


async def run(engine: LocalEngine, batch: list[list[int]], new_tokens: int) -> tuple[float, int]:
    sampling = SamplingParams(temperature=0.7, max_new_tokens=new_tokens, seed=0)
    start = time.perf_counter()
    gens = await asyncio.gather(*[engine.generate(p, sampling, session_id=f"t{i}") for i, p in enumerate(batch)])
    return time.perf_counter() - start, sum(len(g.output_ids) for g in gens)


def hf_generate(engine: LocalEngine, prompt: list[int], new_tokens: int) -> tuple[float, int]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = engine.model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=True,
                                    temperature=0.7, top_p=1.0, top_k=0)
    return time.perf_counter() - start, out.shape[1] - len(prompt)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    path = resolve_model(args.model)
    levels = [int(c) for c in args.concurrency.split(",")]
    engine = LocalEngine(path, max_batch_size=max(levels), seed=0, num_threads=args.threads)
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = prompts(tokenizer, max(levels), args.prompt_tokens)
    await run(engine, batch[:1], 8)  # warm-up
    rows = []
    seconds, tokens = hf_generate(engine, batch[0], args.new_tokens)
    rows.append(("transformers generate()", 1, seconds, tokens))
    for level in levels:
        seconds, tokens = await run(engine, batch[:level], args.new_tokens)
        rows.append(("LocalEngine", level, seconds, tokens))
    await engine.close()
    base = next(t / s for name, c, s, t in rows if name == "LocalEngine" and c == 1) if 1 in levels else None
    print(f"\nmodel: {path.name}, prompt ~{len(batch[0])} tokens, up to {args.new_tokens} new tokens, "
          f"torch threads {torch.get_num_threads()}\n")
    print("| runner | concurrent | wall s | tokens | tokens/s | vs 1 trajectory |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, level, seconds, tokens in rows:
        ratio = f"{tokens / seconds / base:.2f}x" if base else "-"
        print(f"| {name} | {level} | {seconds:.2f} | {tokens} | {tokens / seconds:.1f} | {ratio} |")


if __name__ == "__main__":
    asyncio.run(main())
