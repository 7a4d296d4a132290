"""agentrl env `code_tests`: write a Python function, scored by the fraction of hidden unit tests it passes.

Registered through the `agentrl.envs` entry point (and `@register_env("code_tests")` on import).
"""

from agentrl_code_tests.env import CodeTestsEnv

__all__ = ["CodeTestsEnv"]
