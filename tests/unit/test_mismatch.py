"""Train-inference mismatch (agentrl/trainer/mismatch.py): known logprobs give known numbers, tool tokens and padding
never count, several ranks reduce to the numbers of their union, the numbers reach metrics.jsonl's row and the
per-step table, and a truncated-IS cap that would scale on-policy tokens is refused naming the field."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.metrics import MISMATCH_KEYS, step_metrics, table_header, table_row
from agentrl.trainer.mismatch import partial_sums, reduce_sums, step_mismatch

# two completions, right-padded: row 0 = model, model, tool, model; row 1 = model, model, padding, padding
TRAINER = torch.tensor([[-1.0, -0.5, -3.0, -2.0], [-0.25, -4.0, 0.0, 0.0]])
ENGINE = torch.tensor([[-1.5, -0.5, 0.0, -1.0], [-0.25, -3.5, 0.0, 0.0]])  # 0.0 at the tool token, as stored
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]])


def _k3(r: float) -> float:
    return math.exp(r) - 1.0 - r


def test_known_logprobs_give_known_numbers() -> None:
    r = [0.5, 0.0, -1.0, 0.0, -0.5]  # trainer - engine at the five model tokens; the tool token (-3 vs 0) is out
    got = step_mismatch(TRAINER, ENGINE, MASK)
    assert got["mismatch_logprob_abs_mean"] == pytest.approx(sum(abs(x) for x in r) / 5, abs=1e-15)
    assert got["mismatch_logprob_abs_max"] == 1.0
    assert got["mismatch_kl"] == pytest.approx(sum(_k3(x) for x in r) / 5, abs=1e-15)
    assert got["mismatch_kl"] > 0


def test_identical_logprobs_are_zero_and_nothing_to_count_is_none() -> None:
    assert step_mismatch(TRAINER, TRAINER, MASK) == dict.fromkeys(MISMATCH_KEYS, 0.0)
    assert step_mismatch(TRAINER, ENGINE, torch.zeros_like(MASK)) == dict.fromkeys(MISMATCH_KEYS)


def test_nan_engine_logprob_is_left_out() -> None:
    engine = ENGINE.clone()
    engine[0, 2] = -0.0
    engine[0, 0] = math.nan  # a token the engine could not score
    got = step_mismatch(TRAINER, engine, MASK)
    assert got["mismatch_logprob_abs_mean"] == pytest.approx((0.0 + 1.0 + 0.0 + 0.5) / 4)


def test_ranks_reduce_to_the_numbers_of_their_union() -> None:
    per_rank = torch.stack([partial_sums(TRAINER[i:i + 1], ENGINE[i:i + 1], MASK[i:i + 1]) for i in range(2)])
    empty = partial_sums(TRAINER[:1], ENGINE[:1], torch.zeros_like(MASK[:1]))
    assert reduce_sums(torch.cat([per_rank, empty.unsqueeze(0)])) == step_mismatch(TRAINER, ENGINE, MASK)


def test_float32_inputs_are_differenced_in_float64() -> None:
    trainer = torch.tensor([[-1.0000001]], dtype=torch.float32)
    engine = torch.tensor([[-1.0]], dtype=torch.float32)
    got = step_mismatch(trainer, engine, torch.ones(1, 1))
    assert got["mismatch_logprob_abs_mean"] == abs(float(trainer[0, 0]) - float(engine[0, 0])) > 0


def test_row_and_table_carry_the_mismatch() -> None:
    update: dict[str, Any] = {"loss": 0.5, "mismatch_logprob_abs_mean": 0.0125, "mismatch_logprob_abs_max": 0.375,
                              "mismatch_kl": 1e-4}
    row = step_metrics(3, [], update, rollout_s=1.0, train_s=1.0, sync_s=0.0)
    assert (row["mismatch_logprob_abs_mean"], row["mismatch_logprob_abs_max"], row["mismatch_kl"]) == (0.0125, 0.375,
                                                                                                       1e-4)
    assert "|dlogp|" in table_header() and table_row(row).split()[-2:] == ["1.3e-02", "3.8e-01"]
    empty = step_metrics(3, [], {"loss": 0.5}, rollout_s=1.0, train_s=1.0, sync_s=0.0)
    assert all(empty[k] is None for k in MISMATCH_KEYS) and table_row(empty).split()[-2:] == ["-", "-"]


@pytest.mark.parametrize(("data", "field"), [
    ({"importance_sampling": {"clip_max": 0.5}}, r"importance_sampling.*clip_max=0.5 is below 1"),
    ({"importance_sampling": {"clip_min": 1.5}}, r"importance_sampling.*clip_min=1.5 is above 1"),
])
def test_bad_tis_cap_is_a_config_error_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(TrainConfig, None, data)
    load_config(TrainConfig, None, {"importance_sampling": {"enabled": True, "clip_max": 1.0, "clip_min": 0.5}})
