"""Env base class and registry."""

from agentrl.envs.base import Env, Submission, Task, lease_sandbox, spec_for_env
from agentrl.envs.registry import available_envs, get_env, register_env

__all__ = ["Env", "Submission", "Task", "available_envs", "get_env", "lease_sandbox", "register_env", "spec_for_env"]
