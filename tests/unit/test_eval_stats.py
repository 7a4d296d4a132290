"""The eval statistics on known inputs: exact permutation p-values, bootstrap intervals, samples needed."""

from __future__ import annotations

import pytest

from agentrl.trainer import eval_stats as st


def test_sign_flip_exact_p_values() -> None:
    assert st.sign_flip_p([1.0] * 5) == pytest.approx(2 / 32)  # only all-plus and all-minus reach |mean| 1
    assert st.sign_flip_p([1.0] * 6) == pytest.approx(2 / 64)
    assert st.sign_flip_p([0.5, -0.5]) == 1.0
    assert st.sign_flip_p([0.0, 0.0]) == 1.0 and st.sign_flip_p([]) == 1.0
    assert st.sign_flip_p([1.0, 1.0, 1.0, -1.0]) == pytest.approx(10 / 16)  # |sum| >= 2: 10 of 16 flips


def test_sign_flip_random_is_seeded_and_close_to_exact() -> None:
    diffs = [1.0] * 12 + [-1.0] * 8  # 20 tasks: random flips
    p1, p2 = st.sign_flip_p(diffs, seed=3), st.sign_flip_p(diffs, seed=3)
    assert p1 == p2
    # exact: P(|sum of 20 random signs| >= 4) = 1 - P(|S| <= 2) = 1 - (C(20,9)+C(20,10)+C(20,11))/2^20 = 0.5034
    assert p1 == pytest.approx(0.5034, abs=0.015)


def test_permutation_p_per_task() -> None:
    assert st.permutation_p([0.0] * 4, [1.0] * 4) == pytest.approx(2 / 70)
    assert st.permutation_p([0.0], [1.0]) == 1.0  # one sample per side can never be significant
    assert st.permutation_p([0.0, 0.5], [1.0, 1.0]) == pytest.approx(2 / 6)  # splits of {0, .5, 1, 1}: diffs +-.75 twice
    assert st.permutation_p([1.0, 0.0], [0.0, 1.0]) == 1.0
    big = st.permutation_p([0.0] * 20, [1.0] * 20, seed=1)  # C(40,20) splits: random permutations
    assert big == pytest.approx(1 / (st.RANDOM_PERMUTATIONS + 1))


def test_bootstrap_interval() -> None:
    assert st.bootstrap_ci([0.5] * 7) == (0.5, 0.5)
    assert st.bootstrap_ci([]) is None
    lo, hi = st.bootstrap_ci([0.0] * 10 + [1.0] * 10, seed=0)
    # normal approximation: 0.5 +- 1.96 * sqrt(0.25 / 20) = [0.281, 0.719]
    assert lo == pytest.approx(0.281, abs=0.04) and hi == pytest.approx(0.719, abs=0.04)
    assert st.bootstrap_ci([0.0, 1.0, 1.0], seed=5) == st.bootstrap_ci([0.0, 1.0, 1.0], seed=5)


def test_paired_difference() -> None:
    d = st.paired_difference([0.0] * 6, [1.0] * 6)
    assert d["mean"] == 1.0 and d["ci95"] == (1.0, 1.0) and d["p_value"] == pytest.approx(2 / 64)
    assert d["significant"] and d["tasks"] == 6
    n = st.paired_difference([0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0])
    assert n["mean"] == 0.0 and n["p_value"] == 1.0 and not n["significant"]


def test_samples_needed() -> None:
    # n = (1.95996 + 0.84162)^2 * 2 * 0.25 / delta^2 = 3.9244 / delta^2
    assert [st.samples_needed(d) for d in (0.5, 0.3, 0.2, 0.1)] == [16, 44, 99, 393]
    assert st.samples_needed(0.2, p=0.1) < st.samples_needed(0.2)
    with pytest.raises(ValueError, match="delta"):
        st.samples_needed(0.0)
    assert "0.1 -> 393" in st.samples_table()
