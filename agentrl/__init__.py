"""agentrl: reinforcement learning of LLM agents on multi-turn, tool-using tasks.

See docs/architecture.md for the architecture. Public entry points: `agentrl.sandbox.SandboxPool`, `agentrl.envs.Env` /
`register_env`, `agentrl.runner`, `agentrl.store.TrajectoryStore`, and the `agentrl` command line.
"""

__version__ = "0.1.0"
