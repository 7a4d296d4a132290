"""Statistics of an eval diff, so that a few tasks x few samples are not over-read.

Owns: the 95% bootstrap interval of a mean over tasks, the paired test of candidate vs baseline over tasks (a
sign-flip permutation test of the per-task differences, exact up to 16 tasks, else 20,000 seeded random flips, plus
a paired bootstrap interval of the mean difference), the per-task test (a two-sample permutation test of the
samples' rewards, exact when small), and how many samples per task a difference needs. All seeded: the same inputs
give the same numbers. Pure numpy; no I/O.

    one task, samples b_1..b_n (baseline), c_1..c_m (candidate)
        per-task p-value: P(|mean(C*) - mean(B*)| >= |observed|) over every split of the pooled n+m rewards
    T tasks, per-task scores (means) b_t, c_t, d_t = c_t - b_t
        paired p-value:   P(|mean(s_t d_t)| >= |mean(d_t)|) over sign vectors s in {-1, +1}^T
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np

ALPHA = 0.05
BOOTSTRAPS = 10_000
EXACT_SIGN_FLIP_MAX_TASKS = 16
RANDOM_PERMUTATIONS = 20_000
EXACT_SPLITS_MAX = 50_000
_EPS = 1e-12
PAIRED_TEST = "paired sign-flip permutation test over tasks"


def bootstrap_ci(values: list[float], *, seed: int = 0, level: float = 0.95,
                 boots: int = BOOTSTRAPS) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of `values` (resampling tasks); None when there are none."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(boots, x.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def sign_flip_p(diffs: list[float], *, seed: int = 0) -> float:
    """Two-sided p-value of mean(diffs) == 0 by flipping signs (exact up to EXACT_SIGN_FLIP_MAX_TASKS values)."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0 or not np.any(np.abs(d) > _EPS):
        return 1.0
    observed = abs(d.mean())
    if d.size <= EXACT_SIGN_FLIP_MAX_TASKS:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
        return float(np.mean(np.abs(signs @ d) / d.size >= observed - _EPS))
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(RANDOM_PERMUTATIONS, d.size))
    hits = int(np.sum(np.abs(signs @ d) / d.size >= observed - _EPS))
    return (hits + 1) / (RANDOM_PERMUTATIONS + 1)


def permutation_p(base: list[float], cand: list[float], *, seed: int = 0) -> float:
    """Two-sided p-value of mean(cand) == mean(base) for one task's samples (exact when the splits are few)."""
    if not base or not cand:
        return 1.0
    pooled = np.asarray(base + cand, dtype=float)
    n, m = len(base), len(cand)
    observed = abs(np.mean(cand) - np.mean(base))
    if observed <= _EPS:
        return 1.0
    total = pooled.sum()
    if math.comb(n + m, m) <= EXACT_SPLITS_MAX:
        idx = np.array(list(itertools.combinations(range(n + m), m)))
        cand_sums = pooled[idx].sum(axis=1)
        diffs = cand_sums / m - (total - cand_sums) / n
        return float(np.mean(np.abs(diffs) >= observed - _EPS))
    rng = np.random.default_rng(seed)
    perms = rng.permuted(np.tile(pooled, (RANDOM_PERMUTATIONS, 1)), axis=1)
    diffs = perms[:, :m].mean(axis=1) - perms[:, m:].mean(axis=1)
    return (int(np.sum(np.abs(diffs) >= observed - _EPS)) + 1) / (RANDOM_PERMUTATIONS + 1)


def paired_difference(base: list[float], cand: list[float], *, seed: int = 0) -> dict[str, object]:
    """Candidate minus baseline over tasks scored on both sides: mean, 95% paired bootstrap interval, p-value."""
    diffs = [c - b for b, c in zip(base, cand, strict=True)]
    p = sign_flip_p(diffs, seed=seed)
    return {"tasks": len(diffs), "mean": float(np.mean(diffs)) if diffs else None,
            "ci95": bootstrap_ci(diffs, seed=seed), "p_value": p, "significant": bool(diffs) and p < ALPHA,
            "test": PAIRED_TEST}


def samples_needed(delta: float, *, p: float = 0.5, alpha: float = ALPHA, power: float = 0.8) -> int:
    """Samples per side to detect a difference `delta` in one task's pass rate around `p` (two-sided normal
    approximation of the two-proportion test): n = (z_{1-alpha/2} + z_{power})^2 * 2 p (1 - p) / delta^2."""
    if not 0 < delta <= 1:
        raise ValueError(f"delta={delta}: a difference in pass rate must be in (0, 1]")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return math.ceil(z * z * 2 * p * (1 - p) / (delta * delta))


def samples_table(deltas: tuple[float, ...] = (0.5, 0.3, 0.2, 0.1)) -> str:
    """One line per difference: the samples per task (each side) needed at 95% confidence, 80% power."""
    cells = ", ".join(f"{d:.1f} -> {samples_needed(d)}" for d in deltas)
    return f"difference in a task's pass rate -> samples per side (p=0.5, alpha 0.05, power 0.8): {cells}"
