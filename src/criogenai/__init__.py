"""criogenai: run an AI agent's tool calls on a Celery worker fleet, with Redis.

Define tools with ``@tool``, run workers with ``criogenai worker --tools MODULE``, and run each
turn of tool calls from the agent process with ``Dispatcher.run_turn``.
"""

from ._catalog import Catalog, CatalogEntry
from ._config import Limits, Retry, Settings
from ._errors import (
    ConfigurationError,
    CriogenaiError,
    RemoteToolException,
    ToolDefinitionError,
    ToolError,
    ToolFailed,
)
from ._results import fetch_full
from ._version import __version__
from ._wire import OnToolException, ToolCall, ToolResult, ToolStatus
from .agent import Agent, FakeModel, Model, ModelError, RunNotFound, RunResult
from .dispatcher import (
    AfterHook,
    Allow,
    Answer,
    ApprovalConflict,
    ApprovalNotFound,
    Approvals,
    BeforeHook,
    Block,
    ChangeArguments,
    Dispatcher,
    HookCall,
    InvalidApprovalArguments,
    PendingApproval,
    ResultCache,
)
from .tools import Tool, ToolContext, ToolRegistry, tool, tool_from_schema

__all__ = [
    "AfterHook",
    "Agent",
    "Allow",
    "Answer",
    "ApprovalConflict",
    "ApprovalNotFound",
    "Approvals",
    "BeforeHook",
    "Block",
    "Catalog",
    "CatalogEntry",
    "ChangeArguments",
    "ConfigurationError",
    "CriogenaiError",
    "Dispatcher",
    "FakeModel",
    "HookCall",
    "InvalidApprovalArguments",
    "Limits",
    "Model",
    "ModelError",
    "OnToolException",
    "PendingApproval",
    "RemoteToolException",
    "ResultCache",
    "Retry",
    "RunNotFound",
    "RunResult",
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
    "fetch_full",
    "tool",
    "tool_from_schema",
]
