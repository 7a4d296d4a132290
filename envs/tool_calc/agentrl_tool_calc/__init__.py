"""agentrl env `tool_calc`: arithmetic questions a small model cannot answer from memory; it runs a ```python block
in the sandbox and answers from the output (`ANSWER: n`), scored by the `calc_answer` reward source.

Registered through the `agentrl.envs` / `agentrl.rewards` entry points (and the decorators on import).
"""

from agentrl_tool_calc.env import ToolCalcEnv
from agentrl_tool_calc.reward import CalcAnswer

__all__ = ["CalcAnswer", "ToolCalcEnv"]
