"""One rank of the weight-sync check in test_train_distributed.py, started by torchrun on 2 CPU ranks (gloo).

Every rank wraps the same checkpoint in accelerate (DDP), trains one optimizer step on its own data (DDP averages the
gradients), then the ranks sync the engine together as the trainer does (`LocalWeightSync` with version 1, then
`DiskWeightSync` with version 2 after a second step). Rank 0 holds a real LocalEngine. Every rank's trained tensors
are gathered on rank 0 and compared with what the engine holds; rank 0 writes the verdict as JSON to argv[2].

    python -m torch.distributed.run --nproc_per_node 2 dist_weight_sync_ranks.py <checkpoint> <result.json> <dir>

On GPUs (benchmarks/gpu_smoke.sh, AGENTRL_DIST_DEVICE=cuda under `accelerate launch --use_fsdp ...`) the model is
sharded: every rank's shards are gathered into full tensors (`accelerator.get_state_dict`) and compared instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as tdist
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

from agentrl.engine.local import LocalEngine
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.weight_sync import DiskWeightSync, LocalWeightSync, sharded


def train_step(acc: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer, vocab: int) -> None:
    gen = torch.Generator().manual_seed(100 + acc.process_index)  # each rank its own data
    ids = torch.randint(0, vocab, (2, 12), generator=gen).to(acc.device)
    loss = model(input_ids=ids, labels=ids).loss
    acc.backward(loss)
    opt.step()
    opt.zero_grad()


def compare(acc: Accelerator, model: torch.nn.Module, engine: LocalEngine | None) -> dict[str, float] | None:
    """Max |engine - trained| over every tensor, for every rank's trained copy (on rank 0); a sharded model: for the
    full tensors its ranks' shards make."""
    if sharded(SimpleNamespace(accelerator=acc)):
        full = acc.get_state_dict(model)
        if engine is None:
            return None
        held = engine.model.state_dict()
        return {"gathered": max(float((held[k].cpu() - v.cpu()).abs().max()) for k, v in full.items())}
    mine = {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    every: list[dict[str, torch.Tensor] | None] = [None] * acc.num_processes
    tdist.all_gather_object(every, mine)
    if engine is None:
        return None
    held = engine.model.state_dict()
    return {f"rank{r}": max(float((held[k] - t[k].cpu()).abs().max()) for k in t) for r, t in enumerate(every) if t}


def main() -> None:
    checkpoint, result, directory = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    acc = Accelerator(cpu=os.environ.get("AGENTRL_DIST_DEVICE", "cpu") == "cpu")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt = acc.prepare(model, opt)
    vocab = int(acc.unwrap_model(model).config.vocab_size)
    trainer = SimpleNamespace(accelerator=acc, model=model, processing_class=None)
    engine = LocalEngine(checkpoint, max_batch_size=2) if acc.is_main_process else None
    loop = BackgroundLoop() if acc.is_main_process else None
    out: dict[str, object] = {"world": acc.num_processes, "distributed_type": str(acc.distributed_type)}
    try:
        train_step(acc, model, opt, vocab)
        LocalWeightSync(engine, loop).sync(trainer, 1)  # type: ignore[arg-type]
        out["local"] = compare(acc, model, engine)
        out["local_version"] = engine.weight_version if engine else None
        train_step(acc, model, opt, vocab)
        DiskWeightSync(engine, loop, directory).sync(trainer, 2)  # type: ignore[arg-type]
        out["disk"] = compare(acc, model, engine)
        out["disk_version"] = engine.weight_version if engine else None
        trained = acc.get_state_dict(model)
        if acc.is_main_process:
            out["moved"] = max(float((trained[k].cpu() - initial[k]).abs().max()) for k in initial)
    finally:
        if loop is not None and engine is not None:
            loop.run(engine.close())
            loop.close()
    if acc.is_main_process:
        result.write_text(json.dumps(out))
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
