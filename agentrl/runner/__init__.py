"""The runner: the per-trajectory loop (rollout.py) and the scheduler of groups (scheduler.py)."""

from agentrl.runner.rollout import Budgets, Rollout
from agentrl.runner.scheduler import Progress, Scheduler, SchedulerConfig

__all__ = ["Budgets", "Progress", "Rollout", "Scheduler", "SchedulerConfig"]
