"""Env base class and registry."""

from agentrl.envs.base import Env, Task, lease_sandbox
from agentrl.envs.registry import available_envs, get_env, register_env

__all__ = ["Env", "Task", "available_envs", "get_env", "lease_sandbox", "register_env"]
