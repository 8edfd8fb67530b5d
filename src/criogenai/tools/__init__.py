"""The definition side: tools, their schemas, their validation and their results' text."""

from .._wire import ToolDefinition
from ._content import DEFAULT_MAX_RESULT_CHARS, Content, cut, to_json_text
from ._context import ToolContext
from ._mcp import MCPServer, MCPServerStdio, MCPServerStreamableHTTP
from ._mcp_session import MCPServerError
from ._registry import ToolRegistry
from ._tool import DEFAULT_QUEUE, InvalidArguments, Tool, ValidArguments, tool, tool_from_schema

__all__ = [
    "DEFAULT_MAX_RESULT_CHARS",
    "DEFAULT_QUEUE",
    "Content",
    "InvalidArguments",
    "MCPServer",
    "MCPServerError",
    "MCPServerStdio",
    "MCPServerStreamableHTTP",
    "Tool",
    "ToolContext",
    "ToolDefinition",
    "ToolRegistry",
    "ValidArguments",
    "cut",
    "to_json_text",
    "tool",
    "tool_from_schema",
]
