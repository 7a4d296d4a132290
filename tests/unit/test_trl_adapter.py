"""The TRL adapter without a model: TRL's hooks call the job's step phases in the order StepPhases (phases.py) states,
with the right step numbers; the rollout_func regroups TRL's prompts into one task id per group and echoes the
runner's rewards; TRL's log becomes the update's numbers under agentrl's names."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.errors import ConfigError
from agentrl.trainer.dist import Ranks
from agentrl.trainer.phases import StepPhases
from agentrl.trainer.metrics import UPDATE_KEYS
from agentrl.trainer.trl_adapter.hooks import PhaseCallback, RolloutHook, update_numbers
from agentrl.types import Status, Trajectory, Turn


def _traj(task: str, k: int, reward: float | None) -> Trajectory:
    return Trajectory(id=f"{task}-{k}", group_id=task, task_id=task, env="e", status=Status.ok, sample_index=k,
                      prompt_ids=[1], completion_ids=[5, 2], logprobs=[-0.5, -0.1], env_mask=[1, 1], reward=reward,
                      turns=[Turn(index=0, start=0, model_len=2, weight_version=0)])


class FakePhases:
    """Records the phase calls; rolls out `group_size` trajectories per task id."""

    def __init__(self, group_size: int = 2) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.group_size = group_size
        self.stop_at: int | None = None

    def before_training(self, step: int) -> None:
        self.calls.append(("before_training", step))

    def begin_step(self) -> None:
        self.calls.append(("begin_step",))

    def sync_weights(self, step: int) -> None:
        self.calls.append(("sync_weights", step))

    def rollout_and_score(self, step: int, task_ids: list[str]) -> list[Trajectory]:
        self.calls.append(("rollout_and_score", step, tuple(task_ids)))
        return [_traj(t, k, 0.25 * k) for t in task_ids for k in range(self.group_size)]

    def after_update(self, step: int) -> None:
        self.calls.append(("after_update", step))

    def record_step(self, step: int, update: dict[str, Any]) -> bool:
        self.calls.append(("record_step", step, update["loss"]))
        return step == self.stop_at

    def checkpoint_saved(self, step: int) -> None:
        self.calls.append(("checkpoint_saved", step))

    def after_training(self, step: int) -> None:
        self.calls.append(("after_training", step))


def test_hooks_call_the_phases_in_step_order_with_step_numbers() -> None:
    """One optimizer step as transformers runs its hooks: on_step_begin -> rollout_func -> (update) -> on_step_end
    -> on_log -> on_save; then the end-of-training summary log (no loss) records nothing."""
    phases = FakePhases()
    as_protocol: StepPhases = phases  # the fake has the job's phase signatures
    cb = PhaseCallback(as_protocol)
    hook = RolloutHook(phases, ranks=Ranks(), group_size=2, end_id=2)
    state = SimpleNamespace(global_step=0)
    control = SimpleNamespace(should_training_stop=False)
    cb.on_train_begin(None, state, control)
    cb.on_step_begin(None, state, control)
    batch = hook(["t7", "t7", "t2", "t2"], SimpleNamespace(state=state))
    state.global_step = 1  # optimizer.step
    cb.on_step_end(None, state, control)
    cb.on_log(None, state, control, logs={"loss": 0.5, "kl": 0.1})
    cb.on_save(None, state, control)
    cb.on_log(None, state, control, logs={"train_runtime": 1.0})
    cb.on_train_end(None, state, control)
    assert phases.calls == [("before_training", 0), ("begin_step",), ("sync_weights", 0),
                            ("rollout_and_score", 0, ("t7", "t2")), ("after_update", 1), ("record_step", 0, 0.5),
                            ("checkpoint_saved", 1), ("after_training", 1)]
    assert batch["env_reward"] == [0.0, 0.25, 0.0, 0.25]  # the runner's rewards, echoed
    assert batch["completion_ids"] == [[5, 2]] * 4
    assert not control.should_training_stop


def test_a_stopping_record_step_stops_training() -> None:
    phases = FakePhases()
    phases.stop_at = 0
    control = SimpleNamespace(should_training_stop=False)
    PhaseCallback(phases).on_log(None, SimpleNamespace(global_step=1), control, logs={"loss": 0.5})
    assert control.should_training_stop


def test_the_rollout_func_refuses_prompts_that_are_not_groups() -> None:
    hook = RolloutHook(FakePhases(), ranks=Ranks(), group_size=2, end_id=2)
    with pytest.raises(ConfigError, match="different prompts"):
        hook(["a", "b"], SimpleNamespace(state=SimpleNamespace(global_step=0)))


def test_trl_log_becomes_the_update_numbers() -> None:
    logs = {"loss": 0.5, "kl": 0.01, "clip_ratio/region_mean": 0.2, "sampling/importance_sampling_ratio/mean": 1.0,
            "sampling/importance_sampling_ratio/clipped_frac": 0.0, "mismatch/kl_k3": 1e-4, "reward": 0.3}
    update = update_numbers(logs)
    assert tuple(update) == UPDATE_KEYS
    assert (update["loss"], update["kl"], update["clip_ratio"], update["is_ratio_mean"],
            update["is_ratio_clipped_frac"], update["mismatch_kl"]) == (0.5, 0.01, 0.2, 1.0, 0.0, 1e-4)
    assert update["grad_norm"] is None and update["mismatch_logprob_abs_mean"] is None
