"""GPU smoke check, the Python half of `gpu_smoke.sh`: weight update on every worker, and the numbers to print.

    python benchmarks/gpu_smoke_report.py update --url URL [--url URL ...] --model DIR --out DIR --version N
                                                 [--engine sglang|vllm]
        Saves DIR's weights (slightly perturbed, so a landed update changes outputs) to --out with
        save_pretrained, then `SGLangEngine.update_weights(out, N)` (checks /model_info reports N on every worker)
        or `VLLMEngine.update_weights(out, N)` (pause, reload_weights, reset cache, label; checks /weight_info).

    python benchmarks/gpu_smoke_report.py report --model DIR --summary S.json --rollout A.jsonl [--rollout B.jsonl]
        Prints tokens/s, the cached-token ratio of turns after the first, the weight versions seen, and the logprob
        agreement of the stored (SGLang) logprobs with a transformers recomputation (the trainer's view) of the
        same model tokens: log_softmax(logits / T) of each sampled token, T from the trajectory's sampling meta.
        Use --weights DIR to recompute with another checkpoint (e.g. the updated one for version >= 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path
from typing import Any


def update(a: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.engine.sglang import SGLangEngine, checkpoint_facts
    from agentrl.engine.vllm import VLLMEngine

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * a.noise * p.float().std().to(p.dtype))
    model.save_pretrained(a.out)
    AutoTokenizer.from_pretrained(a.model).save_pretrained(a.out)
    eos, window = checkpoint_facts(a.model)

    async def run() -> dict[str, Any]:
        cls = VLLMEngine if a.engine == "vllm" else SGLangEngine
        engine = cls(urls=a.url, eos_token_ids=eos, context_window=window, model_path=str(a.model))
        try:
            await engine.update_weights(str(a.out), a.version)
            if isinstance(engine, VLLMEngine):
                return await engine.weight_infos()
            return await engine.model_infos()
        finally:
            await engine.close()

    infos = asyncio.run(run())
    landed = ", ".join(f"{u} -> {i['weight_version']}" for u, i in infos.items())
    print(f"weight update to version {a.version}: {landed}")


def report(a: argparse.Namespace) -> None:
    from agentrl.store import read_trajectories

    trajs = [t for path in a.rollout for t in read_trajectories(path)]
    summary = json.loads(Path(a.summary).read_text()) if a.summary else {}
    later = [turn for t in trajs for turn in t.turns[1:]]
    context = [turn_context(t, i) for t in trajs for i in range(1, len(t.turns))]
    cached = sum(turn.cached_tokens for turn in later)
    print(f"trajectories: {len(trajs)}; statuses: {sorted({t.status.value for t in trajs})}")
    print(f"tokens/s (wall, last rollout): {summary.get('tokens_per_s', float('nan')):.1f}; "
          f"engine tokens/s: {summary.get('tokens_per_s_engine', float('nan')):.1f}")
    print(f"cached-token ratio of turns after the first: {cached}/{sum(context)} = "
          f"{cached / max(1, sum(context)):.3f}")
    print(f"weight versions seen: {sorted({turn.weight_version for t in trajs for turn in t.turns})}")
    diffs = logprob_diffs(trajs, a.weights or a.model, a.device, a.version)
    if diffs:
        print(f"logprob agreement with the transformers recomputation ({len(diffs)} tokens): mean |diff| "
              f"{statistics.fmean(diffs):.2e}, p99 {sorted(diffs)[int(0.99 * (len(diffs) - 1))]:.2e}, "
              f"max {max(diffs):.2e}")


def turn_context(t: Any, i: int) -> int:
    """Tokens the engine saw as input for turn i: the prompt plus everything before the turn."""
    return len(t.prompt_ids) + t.turns[i].start


def logprob_diffs(trajs: list[Any], weights: str, device: str, version: int | None) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).to(device).eval()
    out: list[float] = []
    for t in trajs:
        temperature = float(t.meta.get("sampling", {}).get("temperature", 1.0)) or 1.0
        ids = torch.tensor([t.prompt_ids + t.completion_ids], device=device)
        with torch.no_grad():
            logits = model(ids).logits[0, len(t.prompt_ids) - 1 : -1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(t.prompt_ids):, None])[:, 0].tolist()
        for turn in t.turns:
            if version is not None and turn.weight_version != version:
                continue
            for k in range(turn.start, turn.start + turn.model_len):
                out.append(abs(logp[k] - t.logprobs[k]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("update")
    u.add_argument("--url", action="append", required=True)
    u.add_argument("--model", required=True)
    u.add_argument("--out", type=Path, required=True)
    u.add_argument("--version", type=int, default=1)
    u.add_argument("--noise", type=float, default=0.01, help="relative weight perturbation")
    u.add_argument("--engine", choices=["sglang", "vllm"], default="sglang")
    u.set_defaults(func=update)
    r = sub.add_parser("report")
    r.add_argument("--model", required=True)
    r.add_argument("--weights", help="checkpoint for the recomputation (default --model)")
    r.add_argument("--version", type=int, help="only compare turns of this weight version")
    r.add_argument("--summary")
    r.add_argument("--rollout", action="append", required=True)
    r.add_argument("--device", default="cuda")
    r.set_defaults(func=report)
    a = p.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
