"""Run statistics: pure functions of stored trajectories (the rollout summary, `agentrl stats`, train metrics)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from statistics import mean, pstdev

from agentrl.types import Status, Trajectory


def _mean(xs: list[float]) -> float:
    return mean(xs) if xs else 0.0


def summarize(trajectories: Iterable[Trajectory], *, wall_s: float | None = None) -> dict[str, float]:
    """The numbers the rollout summary table shows. Rewards of infra_error trajectories are excluded."""
    trajs = list(trajectories)
    scored = [t for t in trajs if t.reward is not None]
    rewards = [float(t.reward) for t in scored if t.reward is not None]
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in scored:
        groups[t.group_id].append(t)
    group_rewards = [[float(t.reward or 0.0) for t in g] for g in groups.values()]
    tokens = sum(t.num_model_tokens for t in trajs)
    gen_s = sum(t.timing.generation_s for t in trajs)
    out = {
        "trajectories": float(len(trajs)),
        "groups": float(len(groups)),
        "reward_mean": _mean(rewards),
        "reward_std": pstdev(rewards) if len(rewards) > 1 else 0.0,
        "pass_at_1": _mean([float(r >= 1.0) for r in rewards]),
        "pass_at_g": _mean([float(any(r >= 1.0 for r in g)) for g in group_rewards]),
        "nonzero_reward_groups": float(sum(any(r > 0 for r in g) for g in group_rewards)),
        "frac_zero_std_groups": _mean([float(len(set(g)) <= 1) for g in group_rewards]),
        "mean_turns": _mean([float(len(t.turns)) for t in trajs]),
        "tool_calls": float(sum(t.num_tool_calls for t in trajs)),
        "tool_errors": float(sum(t.num_tool_errors for t in trajs)),
        "parse_errors": float(sum(len(turn.parse_errors) for t in trajs for turn in t.turns)),
        "truncations": float(sum(t.status in (Status.truncated, Status.context_exhausted) for t in trajs)),
        "timeouts": float(sum(t.status is Status.timeout for t in trajs)),
        "infra_errors": float(sum(t.status is Status.infra_error for t in trajs)),
        "infra_error_frac": _mean([float(t.status is Status.infra_error) for t in trajs]),
        "policy_errors": float(sum(t.status is Status.policy_error for t in trajs)),
        "template_drift_turns": float(sum(t.drift_count for t in trajs)),
        "drift_check_errors": float(sum(t.drift_check_error is not None for t in trajs)),
        "integrity_flagged": float(sum(bool(t.integrity) for t in trajs)),  # trajectories with integrity signals
        "completion_len_mean": _mean([float(len(t.completion_ids)) for t in trajs]),
        "tokens_generated": float(tokens),
        "tokens_per_s_engine": tokens / gen_s if gen_s else 0.0,
    }
    if wall_s is not None:
        out["wall_s"] = wall_s
        out["tokens_per_s"] = tokens / wall_s if wall_s else 0.0
    return out
