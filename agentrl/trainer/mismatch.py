"""Train-inference mismatch: the engine's sampling logprobs against the trainer's recomputation of the same tokens.

Owns the three per-step numbers and how they are computed (`AgentGRPOTrainer` in the TRL adapter feeds them the tensors
TRL already has; metrics.py writes them to metrics.jsonl):

    mismatch_logprob_abs_mean   mean |logp_trainer - logp_engine| over the step's trained model tokens (nats)
    mismatch_logprob_abs_max    max of the same
    mismatch_kl                 k3 estimate of KL(engine || trainer): mean of exp(r) - 1 - r, r = logp_trainer -
                                logp_engine (the tokens were sampled by the engine, so this is unbiased and >= 0)

Tokens counted: model tokens (env_mask 1) of completions that are in the loss (TRL's completion_mask * tool_mask:
no tool/env tokens, no padding, no truncated completions when `mask_truncated_completions`), whose engine logprob is
finite. The difference is taken in float64. With several ranks each rank sends its (tokens, sum, max, k3 sum) and
the step's numbers are those of the union, exactly as if one rank had held every token.

Does not own where the trainer's logprobs come from (trl_adapter/trainer.py: TRL's `old_per_token_logps` when its
IS path computed them, else one extra no-grad forward pass).
"""

from __future__ import annotations

import torch

from agentrl.trainer.metrics import MISMATCH_KEYS


def partial_sums(trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[tokens, sum |r|, max |r|, sum (exp(r) - 1 - r)] over the masked positions, r = trainer - sampling (float64).

    All three tensors are (B, T); positions where `mask` is 0 or the sampling logprob is NaN are left out."""
    r = trainer_logps.detach().to(torch.float64) - sampling_logps.detach().to(torch.float64)
    keep = mask.bool() & ~torch.isnan(r)
    r = r[keep]
    if r.numel() == 0:
        return torch.zeros(4, dtype=torch.float64, device=trainer_logps.device)
    return torch.stack([torch.tensor(float(r.numel()), dtype=torch.float64, device=r.device), r.abs().sum(),
                        r.abs().max(), (torch.exp(r) - 1.0 - r).sum()])


def reduce_sums(sums: torch.Tensor) -> dict[str, float | None]:
    """The step's metrics from every rank's `partial_sums` stacked as (R, 4); None when no token was counted."""
    sums = sums.reshape(-1, 4).to(torch.float64)
    tokens = float(sums[:, 0].sum())
    if tokens == 0:
        return dict.fromkeys(MISMATCH_KEYS)
    return {
        "mismatch_logprob_abs_mean": float(sums[:, 1].sum()) / tokens,
        "mismatch_logprob_abs_max": float(sums[:, 2].max()),
        "mismatch_kl": float(sums[:, 3].sum()) / tokens,
    }


def step_mismatch(trainer_logps: torch.Tensor, sampling_logps: torch.Tensor,
                  mask: torch.Tensor) -> dict[str, float | None]:
    """The metrics of one rank's tensors (no other ranks)."""
    return reduce_sums(partial_sums(trainer_logps, sampling_logps, mask))
