"""criogenai: run an AI agent's tool calls on a Celery worker fleet, with Redis.

Define tools with ``@tool``, run workers with ``criogenai worker --tools MODULE``, and run each
turn of tool calls from the agent process with ``Dispatcher.run_turn``.
"""

from ._config import Limits, Retry, Settings
from ._errors import (
    ConfigurationError,
    CriogenaiError,
    RemoteToolException,
    ToolDefinitionError,
    ToolError,
    ToolFailed,
)
from ._version import __version__
from ._wire import OnToolException, ToolCall, ToolResult, ToolStatus
from .dispatcher import Dispatcher
from .tools import Tool, ToolContext, ToolRegistry, tool, tool_from_schema

__all__ = [
    "ConfigurationError",
    "CriogenaiError",
    "Dispatcher",
    "Limits",
    "OnToolException",
    "RemoteToolException",
    "Retry",
    "Settings",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolFailed",
    "ToolRegistry",
    "ToolResult",
    "ToolStatus",
    "__version__",
    "tool",
    "tool_from_schema",
]
