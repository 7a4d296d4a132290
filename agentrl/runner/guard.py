"""UnscoredGuard: a run notices when too much of it cannot be scored.

Infra errors are excluded from training; a few are noise, many mean the survivors are a biased sample (the hard
tasks are the ones whose sandboxes time out). The guard counts finished trajectories (after retries) and raises
`UnscoredLimitError` naming the most common cause and the count of every cause (by `error_kind`) once at least
`min_trajectories` are in and more than `max_frac` of them are infra_error. Only infra_error counts, and attribution
(attribution.py) makes that a proven cause outside the policy's reach, so a policy cannot stop a run by failing:
its failures are scored.

`final_verdict` is the same rule applied once a run is over (rollout, eval, envs check): no minimum count, and a run
whose every trajectory was lost always fails.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agentrl.errors import UnscoredLimitError
from agentrl.types import Status, Trajectory


@dataclass
class UnscoredGuard:
    max_frac: float = 0.10
    min_trajectories: int = 20
    total: int = 0
    causes: Counter[str] = field(default_factory=Counter)

    @property
    def unscored(self) -> int:
        return sum(self.causes.values())

    @property
    def frac(self) -> float:
        return self.unscored / self.total if self.total else 0.0

    def add(self, traj: Trajectory) -> None:
        self.total += 1
        if traj.status is Status.infra_error:
            self.causes[traj.error_kind or "unknown"] += 1

    def check(self, *, where: str = "this run") -> None:
        """Raise when the unscored fraction is over the limit (and enough trajectories are in to tell)."""
        if self.total < self.min_trajectories or self.frac <= self.max_frac:
            return
        cause, count = self.causes.most_common(1)[0]
        raise UnscoredLimitError(
            f"{self.unscored}/{self.total} trajectories of {where} ({self.frac:.0%}) ended as infra_error, over "
            f"the limit of {self.max_frac:.0%} (max_unscored_frac); most common cause: {cause} ({count}x). "
            f"Unscored by error_kind: {dict(self.causes.most_common())}. "
            "Fix the cause (agentrl stats / the trajectories' "
            f"`error` field show details) or raise max_unscored_frac if this rate is expected.")

    def summary(self) -> dict[str, object]:
        return {"infra_error_frac": round(self.frac, 4), "unscored_causes": dict(self.causes.most_common())}


EXIT_UNSCORED = 3  # a finished run lost too much to infrastructure: nothing it reports can be trusted


def final_verdict(what: str, infra: int, total: int, max_frac: float) -> str | None:
    """The failure line of a finished run whose share of infra_error trajectories (never scored) is over
    `max_frac`, or None. A run with every trajectory lost (the engine gone, no sandbox) always fails."""
    if total == 0 or (infra <= max_frac * total and infra < total):
        return None
    return (f"error: {what}: {infra}/{total} trajectories ended infra_error (unscored; limit max_unscored_frac="
            f"{max_frac:g}): the engine or the sandboxes failed, see the first infra error in the stored "
            f"trajectories (agentrl stats / agentrl view); exit {EXIT_UNSCORED}")
