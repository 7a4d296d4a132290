"""Options and fixed texts of the tool_calc env: the validated constructor kwargs, the tool spec, the system prompt
and the one-shot example the opening chat carries."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrl.errors import ConfigError
from agentrl.types import Message, ToolSpec


class ToolCalcOptions(BaseModel):
    """`get_env("tool_calc", **options)`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Literal["train", "eval"] = "train"  # disjoint operand pairs (tasks.pair_split)
    tasks: int = Field(default=256, ge=1)  # questions in the split
    digits: int = Field(default=3, ge=2, le=6)  # digits of each operand
    ops: str = "*"  # operators to draw from: any of "*+-"
    run_timeout_s: float = Field(default=10.0, gt=0)  # one ```python block
    output_chars: int = Field(default=400, ge=64)  # stdout/stderr shown to the model

    @field_validator("ops")
    @classmethod
    def _ops(cls, value: str) -> str:
        if not value or set(value) - set("*+-"):
            raise ValueError(f"ops={value!r}: a non-empty string of the operators * + -")
        return "".join(sorted(set(value)))


def parse_options(options: dict[str, Any]) -> ToolCalcOptions:
    try:
        return ToolCalcOptions.model_validate(options)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"env tool_calc: invalid options ({problems}). Fields: "
                          f"{', '.join(ToolCalcOptions.model_fields)}") from exc


RUN_PYTHON = ToolSpec(
    name="run_python",
    description="Runs the Python code in a fresh process and returns what it printed.",
    parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
)

SYSTEM_PROMPT = (
    "You answer arithmetic questions. Do not compute in your head: write a ```python block that prints the result, "
    "and you will see its output. Then reply with one line: ANSWER: <number>"
)

# the one-shot example (a question no split holds: 4-digit operands, the splits' default is 3)
EXAMPLE: list[Message] = [
    Message(role="user", content="What is 1234 * 5678?"),
    Message(role="assistant", content="```python\nprint(1234 * 5678)\n```"),
    Message(role="user", content="7006652"),
    Message(role="assistant", content="ANSWER: 7006652"),
]
