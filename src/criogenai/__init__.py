"""criogenai: run an AI agent's tool calls on a Celery worker fleet, with Redis.

Define tools with ``@tool``, run workers with ``criogenai worker --tools MODULE``, and run each
turn of tool calls from the agent process with ``Dispatcher.run_turn``.
"""

# The errors are imported here; every other public name is imported on first use (PEP 562), so
# that ``import criogenai`` costs next to nothing and a process loads only the engine, models,
# HTTP client, JSON Schema validator or broker client it uses.

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    ApprovalConflict,
    ApprovalNotFound,
    CallFailed,
    ConfigurationError,
    CriogenaiError,
    EmbeddingError,
    InvalidApprovalArguments,
    InvalidQuery,
    MCPServerError,
    ModelError,
    RemoteToolException,
    RunConflict,
    RunNotFound,
    StoreError,
    StoreUnavailable,
    ToolDefinitionError,
    ToolError,
    ToolFailed,
)
from ._keys import task_id
from ._version import __version__

if TYPE_CHECKING:
    from ._config import Limits, Retry, Settings
    from ._results import fetch_full
    from ._wire import OnToolException, PendingApproval, ToolCall, ToolDefinition, ToolResult, ToolStatus
    from .agent import (
        Agent,
        AnthropicModel,
        AssistantMessage,
        FakeModel,
        Model,
        ModelRequest,
        OpenAIModel,
        RunError,
        RunResult,
        RunStatus,
        SystemMessage,
        ToolMessage,
        ToolSpec,
        UserMessage,
    )
    from .dispatcher import (
        AfterHook,
        Allow,
        Answer,
        Approvals,
        BeforeHook,
        Block,
        ChangeArguments,
        Dispatcher,
        HookCall,
        ResultCache,
    )
    from .documents import Collection, Document, Passage, PostgresStore, SQLiteStore
    from .memory import LocalMemoryStore, Memory, OpenAIEmbeddings, RedisMemoryStore
    from .store import Catalog, CatalogEntry
    from .tools import (
        InvalidArguments,
        MCPServer,
        MCPServerStdio,
        MCPServerStreamableHTTP,
        Tool,
        ToolContext,
        ToolRegistry,
        ValidArguments,
        tool,
        tool_from_schema,
    )

_LAZY: dict[str, str] = {
    name: module
    for module, names in {
        "._config": ["Limits", "Retry", "Settings"],
        "._results": ["fetch_full"],
        "._wire": [
            "OnToolException",
            "PendingApproval",
            "ToolCall",
            "ToolDefinition",
            "ToolResult",
            "ToolStatus",
        ],
        ".agent": [
            "Agent",
            "AnthropicModel",
            "AssistantMessage",
            "FakeModel",
            "Model",
            "ModelRequest",
            "OpenAIModel",
            "RunError",
            "RunResult",
            "RunStatus",
            "SystemMessage",
            "ToolMessage",
            "ToolSpec",
            "UserMessage",
        ],
        ".dispatcher": [
            "AfterHook",
            "Allow",
            "Answer",
            "Approvals",
            "BeforeHook",
            "Block",
            "ChangeArguments",
            "Dispatcher",
            "HookCall",
            "ResultCache",
        ],
        # PostgresStore needs the postgres extra (psycopg); criogenai.documents says so if it is missing.
        ".documents": ["Collection", "Document", "Passage", "PostgresStore", "SQLiteStore"],
        ".memory": ["LocalMemoryStore", "Memory", "OpenAIEmbeddings", "RedisMemoryStore"],
        ".store": ["Catalog", "CatalogEntry"],
        ".tools": [
            "InvalidArguments",
            "MCPServer",
            "MCPServerStdio",
            "MCPServerStreamableHTTP",
            "Tool",
            "ToolContext",
            "ToolRegistry",
            "ValidArguments",
            "tool",
            "tool_from_schema",
        ],
    }.items()
    for name in names
}
"""Each public name imported on first use, and the module it comes from."""

__all__ = [
    "AfterHook",
    "Agent",
    "Allow",
    "Answer",
    "AnthropicModel",
    "ApprovalConflict",
    "ApprovalNotFound",
    "Approvals",
    "AssistantMessage",
    "BeforeHook",
    "Block",
    "CallFailed",
    "Catalog",
    "CatalogEntry",
    "ChangeArguments",
    "Collection",
    "ConfigurationError",
    "CriogenaiError",
    "Dispatcher",
    "Document",
    "EmbeddingError",
    "FakeModel",
    "HookCall",
    "InvalidApprovalArguments",
    "InvalidArguments",
    "InvalidQuery",
    "Limits",
    "LocalMemoryStore",
    "MCPServer",
    "MCPServerError",
    "MCPServerStdio",
    "MCPServerStreamableHTTP",
    "Memory",
    "Model",
    "ModelError",
    "ModelRequest",
    "OnToolException",
    "OpenAIEmbeddings",
    "OpenAIModel",
    "Passage",
    "PendingApproval",
    "PostgresStore",
    "RedisMemoryStore",
    "RemoteToolException",
    "ResultCache",
    "Retry",
    "RunConflict",
    "RunError",
    "RunNotFound",
    "RunResult",
    "RunStatus",
    "SQLiteStore",
    "Settings",
    "StoreError",
    "StoreUnavailable",
    "SystemMessage",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolError",
    "ToolFailed",
    "ToolMessage",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "UserMessage",
    "ValidArguments",
    "__version__",
    "fetch_full",
    "task_id",
    "tool",
    "tool_from_schema",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
