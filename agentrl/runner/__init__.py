"""The runner: the per-trajectory loop (rollout.py) and the scheduler of groups (scheduler.py)."""

from agentrl.runner.lag import LoopLag
from agentrl.runner.rollout import Budgets, Rollout
from agentrl.runner.scheduler import Progress, Scheduler, SchedulerConfig, check_time_needs

__all__ = ["Budgets", "LoopLag", "Progress", "Rollout", "Scheduler", "SchedulerConfig", "check_time_needs"]
