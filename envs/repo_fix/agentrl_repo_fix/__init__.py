"""agentrl env `repo_fix`: fix a synthesized bug in a real Python package (a PyPI sdist), graded all-or-nothing by
the package's own test suite. Registered through the `agentrl.envs` entry point (and `@register_env` on import).
`python -m agentrl_repo_fix build` makes the tasks (build.py); docs/envs/repo_fix.md explains the design."""

from agentrl_repo_fix.env import RepoFixEnv

__all__ = ["RepoFixEnv"]
