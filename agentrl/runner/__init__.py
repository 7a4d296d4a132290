"""The runner: the per-trajectory loop (rollout.py) and the scheduler of groups (scheduler.py).

This package face re-exports both for library users and tests. Inside agentrl only the composition root
(agentrl.compose) constructs a Rollout or a Scheduler; other modules import the runner module they use (e.g.
agentrl.runner.lag, agentrl.runner.progress): import contracts in pyproject.toml."""

from agentrl.runner.lag import LoopLag
from agentrl.runner.progress import Progress
from agentrl.runner.rollout import Budgets, Rollout
from agentrl.runner.scheduler import Scheduler, SchedulerConfig, check_time_needs

__all__ = ["Budgets", "LoopLag", "Progress", "Rollout", "Scheduler", "SchedulerConfig", "check_time_needs"]
