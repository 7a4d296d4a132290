"""Tool-call parsing and rendering. Imports only agentrl.types (never engine or sandbox)."""

from agentrl.tools.parsers import (
    CODE_TOOL,
    FORMATS,
    ParseOutcome,
    format_tool_call,
    format_tool_instructions,
    parse_tool_calls,
    validate_arguments,
)

__all__ = [
    "CODE_TOOL",
    "FORMATS",
    "ParseOutcome",
    "format_tool_call",
    "format_tool_instructions",
    "parse_tool_calls",
    "validate_arguments",
]
