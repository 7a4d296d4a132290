"""Deterministic ids and RNG streams of a run (`deterministic: true`). Pure functions of the run's seed.

Owns how a group id, a trajectory id and the per-turn sampling seed are derived, so that neither depends on
scheduling, arrival order or wall time:

    group id          = H(seed, namespace, step, task id, replica)          12 hex chars
    trajectory id     = H(seed, group id, sample index, attempt)            32 hex chars
    trajectory seed   = H(seed, group id, sample index)                     (an infra retry resamples the same way)
    turn seed         = H(trajectory seed, turn index)                      -> SamplingParams.seed of that turn

`namespace` separates runs that share a seed inside one process (evaluation modes, an eval during training);
`replica` separates two groups of the same task in one step (TRL may draw a task twice). H is BLAKE2b over the
parts joined by "|"; seeds are 62-bit non-negative ints (valid for torch.Generator and SGLang's `sampling_seed`).
Without a seed (`IdPlan(None)`) ids are random (uuid4) and no per-turn seed is set: the default, non-deterministic
behaviour. Does not own what the engine does with a seed (engine/local.py, engine/sglang.py).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass


def derive(*parts: object) -> int:
    """A 62-bit seed from `parts` (stable across processes, machines and Python versions)."""
    key = "|".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 2


def derived_hex(*parts: object, chars: int) -> str:
    key = "|".join(str(p) for p in parts).encode()
    return hashlib.blake2b(key, digest_size=16).hexdigest()[:chars]


def turn_seed(trajectory_seed: int, turn: int) -> int:
    """The sampling seed of turn `turn` of a trajectory."""
    return derive(trajectory_seed, "turn", turn)


@dataclass(frozen=True)
class IdPlan:
    """Ids and seeds of one scheduler: derived from `seed` when set, random otherwise (see the module docstring)."""

    seed: int | None = None
    namespace: str = ""

    @property
    def deterministic(self) -> bool:
        return self.seed is not None

    def group_id(self, task_id: str, step: int | None, replica: int = 0) -> str:
        if self.seed is None:
            return uuid.uuid4().hex[:12]
        return derived_hex(self.seed, self.namespace, step, task_id, replica, chars=12)

    def trajectory_id(self, group_id: str, sample_index: int, attempt: int) -> str:
        if self.seed is None:
            return uuid.uuid4().hex
        return derived_hex(self.seed, group_id, sample_index, attempt, chars=32)

    def trajectory_seed(self, group_id: str, sample_index: int) -> int | None:
        """The root of a trajectory's per-turn seeds; None when not deterministic (the engine seeds as before)."""
        if self.seed is None:
            return None
        return derive(self.seed, group_id, sample_index)
