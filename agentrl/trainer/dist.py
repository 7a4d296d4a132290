"""Multi-process training: which rank this process is, and the few collectives a job needs across ranks.

Owns: `Ranks` (rank, world size, local rank, read from the variables `torchrun` and `accelerate launch` set), starting
the process group (accelerate's `PartialState`: gloo on CPU, nccl on GPUs), `Ranks.share` (rank 0 computes,
every rank gets the result; an error on rank 0 is raised on every rank, so no rank waits forever), `Ranks.gather`
(every rank's list, concatenated in rank order), and `rank_slice` of a rollout batch. Does not own what is rolled out
(rollouts.py; the TRL adapter's rollout_func gathers and slices) nor TRL's data split (TRL's sampler and
accelerate's dataloader shard).

The design (docs/training.md, "Scaling out"): rank 0 alone holds the engine client, the sandbox pool, the scheduler
and the store. Each step, every rank hands its slice of TRL's prompts to rank 0, which rolls out the global batch
once, as whole GRPO groups, writes it, and sends every rank its slice back in TRL's order. A group may straddle two
ranks; TRL gathers the rewards of all ranks before it computes the group baselines, so the advantages are the ones
one process would compute.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrl.errors import AgentRLError

T = TypeVar("T")


class RankFailedError(AgentRLError):
    """Rank 0 failed while the other ranks waited for it; raised on those ranks with rank 0's message."""


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Ranks:
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", "1") or 1)
        rank = int(env.get("RANK", "0") or 0)
        return cls(rank=rank, world=world, local_rank=int(env.get("LOCAL_RANK", str(rank)) or rank))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def start(self, device: str) -> None:
        """Join the process group (idempotent; the trainer's accelerate state is the same object later)."""
        if not self.distributed:
            return
        from accelerate import PartialState

        PartialState(cpu=device == "cpu")

    def stop(self) -> None:
        """Leave the process group before the interpreter exits (idempotent). A gloo group left to interpreter
        shutdown can abort a rank at exit ("terminate called without an active exception", SIGABRT) after a run
        that finished: its exit status then fails the job."""
        if not self.distributed:
            return
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            tdist.destroy_process_group()

    def share(self, compute: Callable[[], T]) -> T:
        """`compute()` on rank 0, its result on every rank. Rank 0's exception is re-raised on rank 0 and raised as
        RankFailedError (with its message) on the others."""
        if not self.distributed:
            return compute()
        import torch.distributed as tdist

        box: list[Any] = [None]
        error: BaseException | None = None
        if self.is_main:
            try:
                box[0] = ("ok", compute())
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others were told
                error = exc
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
        tdist.broadcast_object_list(box, src=0)
        if error is not None:
            raise error
        kind, value = box[0]
        if kind == "error":
            raise RankFailedError(f"rank 0 failed: {value}")
        return value

    def gather(self, items: list[Any]) -> list[Any] | None:
        """Every rank's `items`, concatenated in rank order, on rank 0 (None on the others)."""
        if not self.distributed:
            return list(items)
        import torch.distributed as tdist

        out: list[Any] | None = [None] * self.world if self.is_main else None
        tdist.gather_object(list(items), out, dst=0)
        return None if out is None else [x for part in out for x in part]


def rank_slice(batch: dict[str, list[Any]], rank: int, rows: int) -> dict[str, list[Any]]:
    """Rows [rank*rows, (rank+1)*rows) of every column of a rollout batch: the rows TRL gave this rank prompts for
    (accelerate hands rank r the r-th contiguous chunk of the global generation batch)."""
    lo = rank * rows
    return {k: v[lo: lo + rows] for k, v in batch.items()}
