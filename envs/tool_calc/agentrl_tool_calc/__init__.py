"""agentrl envs `tool_calc`: arithmetic questions a small model cannot answer from memory; it runs a ```python block
in the sandbox and answers from the output (`ANSWER: n`), scored by the `calc_answer` reward source; and
`tool_chain`: a hidden function only the sandbox can evaluate, applied k times, so each answer needs what the tool
printed (`chain_answer`).

Registered through the `agentrl.envs` / `agentrl.rewards` entry points (and the decorators on import).
"""

from agentrl_tool_calc.chain_env import ChainAnswer, ToolChainEnv
from agentrl_tool_calc.env import ToolCalcEnv
from agentrl_tool_calc.reward import CalcAnswer

__all__ = ["CalcAnswer", "ChainAnswer", "ToolCalcEnv", "ToolChainEnv"]
