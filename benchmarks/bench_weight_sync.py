"""Weight sync of a LoRA run, full weights vs adapter only, side by side in one run (issue 23 item 3).

Each step: new LoRA weights on the trainer's PEFT model (as an optimizer step would leave them), then
    full     DiskWeightSync: save the merged full weights + tokenizer, engine.update_weights(path)
    adapter  AdapterWeightSync: save the adapter alone, engine.load_adapter(path)
into two local engines (the in-process loader of each path). Measured per step: bytes written, save seconds, load
seconds, their sum; and the largest difference between the two engines' weights after the step (both must hold the
trained model's merged weights). The 7B numbers are computed, not measured (a 7B model does not fit this machine's
time budget): parameter counts of the Qwen2.5-7B shape, bf16 full weights vs an fp32 adapter.

    python benchmarks/bench_weight_sync.py [--steps 3] [--r 16] [--alpha 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from agentrl.engine.local import LocalEngine
from agentrl.engine.models import resolve_model
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.weight_sync import AdapterWeightSync, DiskWeightSync

#: (hidden, intermediate, layers, attention heads, kv heads, head dim, vocab, tied embeddings) of Qwen2.5-7B
QWEN25_7B = (3584, 18944, 28, 28, 4, 128, 152064, False)


class Trainer:
    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.processing_class = model, tokenizer
        self.accelerator = SimpleNamespace(unwrap_model=lambda m: m, is_main_process=True,
                                           wait_for_everyone=lambda: None)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def timed_sync(sync: Any, trainer: Trainer, version: int, loop: BackgroundLoop, load: Any) -> tuple[float, float]:
    t0 = time.perf_counter()
    path = sync.save(trainer, version)
    t1 = time.perf_counter()
    loop.run(load(str(path), version))
    return t1 - t0, time.perf_counter() - t1


@torch.no_grad()
def step(peft: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in peft.named_parameters():
        if "lora_" in name:
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)


def lora_params_7b(r: int) -> tuple[int, int]:
    """(full parameters, LoRA parameters on all linear layers of the attention + MLP blocks) of the Qwen2.5-7B shape."""
    hidden, inter, layers, heads, kv, hd, vocab, tied = QWEN25_7B
    linears = [(hidden, heads * hd), (hidden, kv * hd), (hidden, kv * hd), (heads * hd, hidden),
               (hidden, inter), (hidden, inter), (inter, hidden)]
    per_layer = sum(i * o for i, o in linears) + (heads * hd + 2 * kv * hd)  # + q/k/v biases
    full = layers * (per_layer + 2 * hidden) + vocab * hidden * (1 if tied else 2) + hidden
    lora = layers * sum(r * (i + o) for i, o in linears)
    return full, lora


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--r", type=int, default=16)
    parser.add_argument("--alpha", type=int, default=32)
    args = parser.parse_args()
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = resolve_model(None)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
                          LoraConfig(r=args.r, lora_alpha=args.alpha, target_modules="all-linear", lora_dropout=0.0,
                                     task_type="CAUSAL_LM"))
    trainer = Trainer(peft, tokenizer)
    rows: dict[str, list[tuple[int, float, float]]] = {"full": [], "adapter": []}
    diffs = []
    with BackgroundLoop() as loop, tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
        full_engine = loop.run(_engine(model_path))
        adapter_engine = loop.run(_engine(model_path))
        full = DiskWeightSync(full_engine, loop, Path(tmp) / "full")
        adapter = AdapterWeightSync(adapter_engine, loop, Path(tmp) / "adapter")
        try:
            for version in range(1, args.steps + 1):
                step(peft, version)
                s, lo = timed_sync(full, trainer, version, loop, full_engine.update_weights)
                rows["full"].append((dir_bytes(Path(tmp) / "full" / f"step-{version:07d}"), s, lo))
                s, lo = timed_sync(adapter, trainer, version, loop, adapter_engine.load_adapter)
                rows["adapter"].append((dir_bytes(Path(tmp) / "adapter" / f"adapter-{version:07d}"), s, lo))
                a, b = full_engine.model.state_dict(), adapter_engine.model.state_dict()
                diffs.append(max(float((a[k] - b[k]).abs().max()) for k in a))
        finally:
            loop.run(full_engine.close())
            loop.run(adapter_engine.close())
    load = os.getloadavg()
    print(f"SmolLM2-135M fp32, LoRA r={args.r} alpha={args.alpha} all-linear, {args.steps} steps, local engine, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print(f"{'mode':<8} {'bytes/step':>14} {'save s':>8} {'load s':>8} {'sync s':>8}   (medians)")
    med: dict[str, tuple[float, float, float, float]] = {}
    for mode, values in rows.items():
        b = statistics.median(v[0] for v in values)
        s = statistics.median(v[1] for v in values)
        lo = statistics.median(v[2] for v in values)
        t = statistics.median(v[1] + v[2] for v in values)
        med[mode] = (b, s, lo, t)
        print(f"{mode:<8} {int(b):>14,} {s:>8.3f} {lo:>8.3f} {t:>8.3f}")
    fb, ab = med["full"][0], med["adapter"][0]
    print(f"ratio full/adapter: bytes {fb / ab:.1f}x, sync time {med['full'][3] / med['adapter'][3]:.1f}x")
    print(f"max |full engine - adapter engine| weight difference after each step: {diffs}")
    full7, lora7 = lora_params_7b(args.r)
    print(f"7B (Qwen2.5-7B shape, computed): full {full7 / 1e9:.2f} B params = {full7 * 2 / 1e9:.1f} GB bf16; adapter "
          f"r={args.r} all-linear {lora7 / 1e6:.1f} M params = {lora7 * 4 / 1e6:.0f} MB fp32 "
          f"({full7 * 2 / (lora7 * 4):.0f}x less)")


async def _engine(path: Path) -> LocalEngine:
    return LocalEngine(path, seed=0, prefix_cache_mb=0)


if __name__ == "__main__":
    main()
