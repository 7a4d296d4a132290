"""Experiment trackers without a training run: `report_to` parsing, the up-front missing-library error (config and
CLI), the generic forwarding of every numeric metric, the per-step media, and TensorBoard's resume semantics on the
real library (tests/integration/test_trackers.py runs all four trackers in a real training run)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agentrl import cli
from agentrl.cli.train import add_train_commands, train_argv
from agentrl.errors import MissingDependencyError
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.trackers import TrackerSet, check_trackers, read_state
from agentrl.trainer.trackers.record import histograms, scalars, trajectory_table
from agentrl.types import Status, Trajectory, Turn


@pytest.mark.parametrize(("given", "want"), [
    ("tensorboard", ["tensorboard"]), ("tensorboard, wandb", ["tensorboard", "wandb"]),
    (["mlflow", "trackio,mlflow"], ["mlflow", "trackio"]), ("none", []), ([], [])])
def test_report_to_accepts_a_name_a_comma_list_or_a_list(given: Any, want: list[str]) -> None:
    assert TrainConfig.model_validate({"report_to": given}).report_to == want


def test_report_to_refuses_an_unknown_tracker_by_field() -> None:
    with pytest.raises(ValidationError, match="report_to"):
        TrainConfig.model_validate({"report_to": ["tensorbord"]})


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else real(name, *a))


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "wandb", "alembic")
    with pytest.raises(MissingDependencyError, match=r"pip install 'agentrl\[wandb\]'"):
        check_trackers(["wandb"])
    with pytest.raises(MissingDependencyError, match=r"mlflow needs alembic.*agentrl\[mlflow\]"):
        check_trackers(["mlflow"])


def test_cli_refuses_a_missing_tracker_before_training(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _hide(monkeypatch, "trackio")
    config = tmp_path / "job.yaml"
    config.write_text(f"output_dir: {tmp_path / 'run'}\nreport_to: [tensorboard]\n")
    rc = cli.main(["train", "--config", str(config), "--report-to", "tensorboard,trackio"])
    err = capsys.readouterr().err
    assert rc != 0 and "agentrl[trackio]" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing built or written


def test_report_to_reaches_every_rank_of_nproc() -> None:
    parser = argparse.ArgumentParser()
    add_train_commands(parser.add_subparsers())
    a = parser.parse_args(["train", "--config", "j.yaml", "--report-to", "tensorboard,wandb", "--report-to", "mlflow"])
    assert train_argv(a)[3:] == ["--report-to", "tensorboard,wandb", "--report-to", "mlflow"]


def test_tokens_per_s_is_a_timing_metric() -> None:
    """It differs between identical runs, so determinism checks and `agentrl diff` leave it out."""
    from agentrl.trainer.metrics import is_timing

    assert is_timing("tokens_per_s") and not is_timing("pass_at_g")


def test_every_numeric_metric_is_forwarded_including_new_ones() -> None:
    row = {"step": 3, "reward_mean": 0.5, "tool_errors": 2, "kl": None, "weight_versions": [3], "env": "x",
           "reused_rollout": True, "mismatch_kl_mean": 0.01, "mismatch": {"p99": 0.2}, "nan": float("nan")}
    assert scalars(row) == {"train/reward_mean": 0.5, "train/tool_errors": 2.0, "train/reused_rollout": 1.0,
                            "train/mismatch_kl_mean": 0.01, "train/mismatch/p99": 0.2}


def _trajs(step: int) -> list[Trajectory]:
    out = []
    for i in range(4):
        n = 3 + i
        out.append(Trajectory(id=f"s{step}-{i}", group_id=f"g{i // 2}", task_id=f"t{i // 2}", env="x",
                              status=Status.infra_error if i == 3 else Status.ok, sample_index=i % 2,
                              prompt_ids=[1], completion_ids=[1] * n, logprobs=[0.0] * n, env_mask=[1] * n,
                              reward=None if i == 3 else i / 2, turns=[Turn(index=0, start=0, model_len=n,
                                                                            text=f"turn {i}")]))
    return out


def test_histograms_leave_unscored_rewards_out_and_table_takes_one_sample_per_group_first() -> None:
    hists = histograms(_trajs(0))
    assert hists["train/reward"] == [0.0, 0.5, 1.0]  # the infra_error trajectory has no reward, not 0
    assert hists["train/completion_len"] == [3.0, 4.0, 5.0, 6.0] and hists["train/turns"] == [1.0] * 4
    table = trajectory_table(0, _trajs(0), {"t0": "print 1"}, 2)
    assert [(r[1], r[2]) for r in table] == [("t0", 0), ("t1", 0)] and table[0][6] == "print 1"


def test_tensorboard_resume_purges_redone_steps_and_keeps_the_run(tmp_path: Path) -> None:
    """A crash after step 1 was logged but before its checkpoint: the resumed run redoes step 1; TensorBoard shows
    the redone value once. Evaluation results wait for the step before them."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    with TrackerSet(tmp_path, ["tensorboard"], project="p") as trackers:
        trackers.log_step({"step": 0, "reward_mean": 0.0}, _trajs(0))
        trackers.log_eval(2, {"modes": {"sampled": {"mean": 0.7, "tasks": {"a": {"score": 0.7}}}}})
        assert read_state(tmp_path)["tensorboard"]["last_eval_step"] == -1  # held until step 1 is logged
        trackers.log_step({"step": 1, "reward_mean": 1.0}, _trajs(1))
    assert read_state(tmp_path)["tensorboard"]["last_eval_step"] == 2
    with TrackerSet(tmp_path, ["tensorboard"], resume_step=1, project="p") as trackers:
        trackers.log_step({"step": 1, "reward_mean": 1.5}, _trajs(1))
        trackers.log_step({"step": 2, "reward_mean": 2.0}, _trajs(2))
    acc = plugin_event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    points = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors("train/reward_mean")]
    assert points == [(0, 0.0), (1, 1.5), (2, 2.0)]
    assert read_state(tmp_path)["tensorboard"]["last_step"] == 2
