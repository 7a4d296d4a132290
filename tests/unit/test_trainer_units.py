"""Trainer pieces without a model: the job config, the GRPOConfig mapping, the rollout_func batch contract, resume
bookkeeping, the eval diff, the resume-stable sampler and the background loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.compose import run_sampling
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.eval import diff_evals, format_diff, task_scores
from agentrl.trainer.loop import BackgroundLoop
from agentrl.trainer.resume import prepare_resume, split_store
from agentrl.trainer.trl_adapter.hooks import env_reward, group_blocks, to_trl_batch
from agentrl.trainer.trl_adapter.trainer import EpochRepeatSampler, grpo_config
from agentrl.types import SamplingParams, Status, Trajectory, Turn


def traj(step: int | None, group: str, task: str = "t", *, k: int = 0, g: int = 2, reward: float | None = 0.5,
         status: Status = Status.ok, ids: list[int] | None = None) -> Trajectory:
    ids = [5, 6, 2] if ids is None else ids
    return Trajectory(id=f"{group}-{k}", group_id=group, task_id=task, env="e", status=status, step=step,
                      sample_index=k, prompt_ids=[1, 2, 3], completion_ids=ids, logprobs=[-0.5] * len(ids),
                      env_mask=[1] * len(ids), reward=reward, meta={"group_size": g},
                      turns=[Turn(index=0, start=0, model_len=len(ids), weight_version=step or 0)])


# -- config ---------------------------------------------------------------------------------------------------------

def test_config_rejects_unknown_keys_naming_the_field(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("steps: 3\nlora:\n  rank: 8\n")
    with pytest.raises(ConfigError, match=r"lora\.rank.*unknown key") as e:
        load_config(TrainConfig, f)
    assert str(f) in str(e.value)


@pytest.mark.parametrize(("data", "field"), [
    ({"sampling": {"temperature": 0.0}}, "temperature"),
    ({"engine": {"type": "local", "model": "x"}}, "top-level `model`"),
    ({"batch_size": 3, "group_size": 4, "micro_batch_size": 5}, "micro_batch_size"),
    ({"group_size": 1}, "group_size"),
])
def test_config_rules(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(TrainConfig, None, data)


def test_one_sampling_config_maps_to_grpo_config(tmp_path: Path) -> None:
    cfg = TrainConfig(output_dir=tmp_path, batch_size=3, group_size=4, micro_batch_size=6, steps=7, seed=5,
                      sampling={"temperature": 0.8, "top_p": 0.95, "top_k": 20, "max_new_tokens": 64},
                      budgets={"max_completion_tokens": 300}, checkpoint_every=2, beta=0.01, loss_type="grpo")
    sampling = run_sampling(cfg.rollout_config(), [2])
    assert sampling.stop_token_ids == [2] and sampling.seed == 5
    args = grpo_config(cfg, sampling)
    assert (args.temperature, args.top_p, args.top_k) == (0.8, 0.95, 20)
    assert args.max_completion_length == 300 and args.num_generations == 4 and args.max_steps == 7
    assert args.per_device_train_batch_size == 6 and args.gradient_accumulation_steps == 2
    assert args.generation_batch_size == 12  # one rollout_func call per optimizer step, all B*G prompts
    assert args.output_dir == str(tmp_path / "checkpoints") and args.save_steps == 2
    assert args.use_cpu and not args.bf16 and not args.gradient_checkpointing and args.report_to == []
    assert args.beta == 0.01 and args.loss_type == "grpo" and not args.remove_unused_columns
    r = cfg.rollout_config()
    assert r.out == tmp_path / "trajectories.jsonl" and r.group_size == 4 and r.sampling == cfg.sampling


# -- rollout_func contract ------------------------------------------------------------------------------------------

def test_group_blocks_never_reexpand_and_check_groups() -> None:
    assert group_blocks(["a", "a", "b", "b"], 2) == [["a", "a"], ["b", "b"]]
    assert group_blocks(["a", "a", "a", "a"], 2) == [["a", "a"], ["a", "a"]]  # same task drawn twice: 2 groups
    with pytest.raises(ConfigError, match="num_generations"):
        group_blocks(["a", "a", "b"], 2)
    with pytest.raises(ConfigError, match="different prompts"):
        group_blocks(["a", "b"], 2)


def test_trl_batch_rows_and_infra_errors() -> None:
    ok = traj(0, "g", ids=[7, 8, 2])
    bad = traj(0, "g", k=1, reward=None, status=Status.infra_error, ids=[9])
    batch = to_trl_batch([ok, bad], end_id=2)
    assert batch["prompt_ids"] == [[1, 2, 3], [1, 2, 3]]
    assert batch["completion_ids"] == [[7, 8, 2], [2]]
    assert batch["env_mask"] == [[1, 1, 1], [0]]  # no gradient from an infra error
    assert batch["logprobs"] == [[-0.5] * 3, [0.0]]
    assert batch["env_reward"] == [0.5, None]
    assert env_reward(prompts=["a", "a"], completions=["", ""], env_reward=batch["env_reward"]) == [0.5, None]
    assert batch["status"] == ["ok", "infra_error"] and batch["weight_version"] == [0, 0]


# -- resume -----------------------------------------------------------------------------------------------------------

def _write_store(path: Path, trajs: list[Trajectory]) -> None:
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajs))


def test_prepare_resume_cuts_back_to_the_last_complete_checkpoint(tmp_path: Path) -> None:
    steps = {s: [traj(s, f"s{s}g{j}", task=f"t{j}", k=k) for j in range(2) for k in range(2)] for s in range(3)}
    partial = [traj(3, "s3g0", k=0)]  # step 3 was cut mid-rollout
    _write_store(tmp_path / "trajectories.jsonl", steps[0] + steps[1] + steps[2] + partial)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(3)) + '{"st')
    for n, complete in ((1, True), (2, True), (3, False)):
        d = tmp_path / "checkpoints" / f"checkpoint-{n}"
        d.mkdir(parents=True)
        if complete:
            (d / "trainer_state.json").write_text(json.dumps({"global_step": n}))
    state = prepare_resume(tmp_path, rows_per_step=4)
    assert state.step == 2 and state.checkpoint is not None and state.checkpoint.name == "checkpoint-2"
    assert not (tmp_path / "checkpoints" / "checkpoint-3").exists()  # cut by the crash: removed
    assert [t.id for t in state.reuse[2]] == [t.id for t in steps[2]]
    assert (state.kept, state.dropped) == (8, 1)
    from agentrl.store import read_trajectories

    assert [t.id for t in read_trajectories(tmp_path / "trajectories.jsonl")] == [t.id for t in steps[0] + steps[1]]
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1]


def test_partial_step_is_not_reused() -> None:
    rows = [traj(1, "a", k=0), traj(1, "a", k=1), traj(1, "b", k=0)]  # group b lost a member
    kept, reuse, dropped = split_store([traj(0, "z", k=0), traj(0, "z", k=1)] + rows, step=1, rows_per_step=3)
    assert len(kept) == 2 and reuse is None and dropped == 3


def test_resume_without_checkpoint_starts_at_zero(tmp_path: Path) -> None:
    _write_store(tmp_path / "trajectories.jsonl", [traj(0, "g", k=0), traj(0, "g", k=1)])
    state = prepare_resume(tmp_path, rows_per_step=2)
    assert state.step == 0 and state.checkpoint is None and len(state.reuse[0]) == 2 and state.kept == 0


# -- eval diff --------------------------------------------------------------------------------------------------------

def _result(label: str, rewards: dict[str, list[float | None]], order: list[str]) -> dict[str, Any]:
    trajs = [traj(None, f"{label}-{tid}", task=tid, k=k, reward=r,
                  status=Status.infra_error if r is None else Status.ok)
             for tid in order for k, r in enumerate(rewards[tid])]
    scores = task_scores(trajs)
    return {"label": label, "task_ids": order,
            "modes": {"sampled": {"tasks": scores, "mean": None}, "greedy": {"tasks": scores, "mean": None}}}


def test_eval_diff_joins_by_task_id_not_order() -> None:
    base = _result("A", {"x": [0.0, 0.5], "y": [1.0], "z": [0.5], "w": [None], "v": [0.0] * 4},
                   ["x", "y", "z", "w", "v"])
    cand = _result("B", {"z": [0.5], "y": [0.0], "x": [1.0, 1.0], "w": [1.0], "v": [1.0] * 4},
                   ["z", "y", "x", "w", "v"])
    report = diff_evals(base, cand)
    rows = {r["task_id"]: r for r in report["modes"]["sampled"]["tasks"]}
    assert rows["x"]["baseline"] == 0.25 and rows["x"]["candidate"] == 1.0
    assert rows["x"]["verdict"] == "n.s." and rows["x"]["p_value"] == pytest.approx(1 / 3)  # 2 vs 2 samples
    assert rows["y"]["verdict"] == "n.s." and rows["y"]["p_value"] == 1.0  # one sample per side never tells
    assert rows["v"]["verdict"] == "better" and rows["v"]["p_value"] == pytest.approx(2 / 70)  # 4 vs 4, exact
    assert rows["z"]["verdict"] == "unchanged"
    assert rows["w"]["verdict"] == "missing"  # every baseline run was an infra error: not a regression
    m = report["modes"]["greedy"]
    assert (m["better"], m["worse"], m["n.s."], m["unchanged"], m["missing"]) == (1, 0, 2, 1, 1)
    d = m["difference"]  # diffs 0, -1, .75, 1: every one of the 16 sign flips has |sum| >= .75 -> p = 1
    assert d["tasks"] == 4 and d["mean"] == pytest.approx(0.1875) and d["test"].startswith("paired sign-flip")
    assert d["p_value"] == 1.0 and not d["significant"]
    text = format_diff(report)
    assert "better 1  worse 0  n.s. 2  unchanged 1  missing 1" in text and "not significant (n.s.)" in text
    assert "samples per side" in text  # n.s. rows come with how many samples would tell


# -- sampler / loop ---------------------------------------------------------------------------------------------------

def test_epoch_sampler_order_depends_only_on_seed_and_epoch() -> None:
    def order(epochs: list[int]) -> list[list[int]]:
        s = EpochRepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=3, seed=4)
        out = []
        for e in epochs:
            s.set_epoch(e)
            out.append(list(s))
        return out

    fresh, resumed = order([0, 1, 2]), order([2])
    assert resumed[0] == fresh[2]  # a resume at epoch 2 sees what the uninterrupted run saw
    assert fresh[0] != fresh[1]
    assert fresh[0][:2] == [fresh[0][0]] * 2 and len(fresh[0]) == 3 * 3 * 2


def test_background_loop_runs_and_cleans_up() -> None:
    cleaned: list[str] = []

    async def ok() -> int:
        return 7

    async def boom() -> None:
        raise ValueError("x")

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("slow")

    with BackgroundLoop() as loop:
        assert loop.run(ok()) == 7
        with pytest.raises(ValueError):
            loop.run(boom())
        with pytest.raises(TimeoutError):
            loop.run(slow(), timeout=0.1)
        assert cleaned == ["slow"]  # the cancelled coroutine's finally ran before run() returned
    assert loop.closed


def test_sampling_params_for_training_keep_logprob_semantics() -> None:
    cfg = TrainConfig(sampling=SamplingParams(temperature=1.0, stop_token_ids=[9]))
    assert run_sampling(cfg.rollout_config(), [2]).stop_token_ids == [9]  # explicit stop ids win
