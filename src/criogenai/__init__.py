"""criogenai: run an AI agent's tool calls on a Celery worker fleet, with Redis.

Define tools with ``@tool``, run workers with ``criogenai worker --tools MODULE``, and run each
turn of tool calls from the agent process with ``Dispatcher.run_turn``.
"""

from typing import TYPE_CHECKING, Any

from ._config import Limits, Retry, Settings
from ._errors import (
    CallFailed,
    ConfigurationError,
    CriogenaiError,
    RemoteToolException,
    StoreError,
    StoreUnavailable,
    ToolDefinitionError,
    ToolError,
    ToolFailed,
)
from ._keys import task_id
from ._results import fetch_full
from ._version import __version__
from ._wire import OnToolException, ToolCall, ToolResult, ToolStatus
from .agent import (
    Agent,
    AnthropicModel,
    AssistantMessage,
    FakeModel,
    Model,
    ModelError,
    ModelRequest,
    OpenAIModel,
    RunConflict,
    RunError,
    RunNotFound,
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
from .documents import Collection, Document, InvalidQuery, Passage, SQLiteStore
from .memory import EmbeddingError, LocalMemoryStore, Memory, OpenAIEmbeddings, RedisMemoryStore
from .store import Catalog, CatalogEntry
from .tools import (
    InvalidArguments,
    MCPServer,
    MCPServerError,
    MCPServerStdio,
    MCPServerStreamableHTTP,
    Tool,
    ToolContext,
    ToolDefinition,
    ToolRegistry,
    ValidArguments,
    tool,
    tool_from_schema,
)

if TYPE_CHECKING:
    from .documents import PostgresStore

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
    # PostgresStore needs the postgres extra (psycopg); it is imported only when asked for.
    if name == "PostgresStore":
        from .documents import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
