"""The order of one training step (`StepPhases`), in a module of its own: the job (job.py) implements it through
steps.TrainingSteps and the TRL adapter (trl_adapter/) calls it from TRL's hooks, so neither imports the other for it.
"""

from __future__ import annotations

from typing import Any, Protocol

from agentrl.types import Trajectory


class StepPhases(Protocol):
    """One training step, in the order it runs. TRL's `trainer.train()` drives the loop; the TRL adapter
    (trl_adapter/hooks.py) calls each phase from the hook named (steps.TrainingSteps implements them). `s` = optimizer
    steps done before the step = the weights version the step rolls out with.

        before_training(s)           on_train_begin            table header; at s = 0: baseline eval + snapshot
        begin_step()                 on_step_begin             the step's clock starts
        1. sync_weights(s)           rollout_func, first       the engine gets weights version s (no-op if it has
                                     (and the IS shim's hook)  it: evaluation or a snapshot may have synced it)
        2. rollout_and_score(s, ids) rollout_func              the step's groups, one per task id, run and scored by
                                                               the runner (the pipeline), stored; their rewards are
                                                               echoed to TRL as its one reward function
        3. advantages                TRL (_generate_and_score_completions)   group-normalised, from those rewards
        4. update                    TRL (training_step, optimizer.step)     global_step becomes s + 1
        5. after_update(s + 1)       on_step_end               eval every eval_every steps (syncs the weights)
        6. record_step(s, update)    on_log                    metrics row, trackers, integrity alarm; True: stop
        7. checkpoint_saved(s + 1)   on_save                   after TRL saved checkpoint-(s+1) (every
                                                               checkpoint_every steps): behaviour snapshot
        after_training(s_last)       on_train_end              the last eval
    """

    def before_training(self, step: int) -> None: ...
    def begin_step(self) -> None: ...
    def sync_weights(self, step: int) -> None: ...
    def rollout_and_score(self, step: int, task_ids: list[str]) -> list[Trajectory]: ...
    def after_update(self, step: int) -> None: ...
    def record_step(self, step: int, update: dict[str, Any]) -> bool: ...
    def checkpoint_saved(self, step: int) -> None: ...
    def after_training(self, step: int) -> None: ...
