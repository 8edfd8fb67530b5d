"""An MCP ``tools/call`` result as criogenai's: the text the model reads and what the run keeps.

Text blocks are the content; ``structuredContent`` is the content as JSON (the text blocks beside
it are by the spec's convention the same value serialized); images, audio, embedded resources and
resource links are kept in the result's artifact (``artifact["mcp"]["content"]``), the model reading
a short line for each instead. ``isError`` is a ``ToolError`` with the server's text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import ToolError
from .._wire import DEFAULT_MAX_STORED_CHARS
from ._content import ToolOutput

if TYPE_CHECKING:
    from mcp_types import CallToolResult


def to_output(result: CallToolResult) -> ToolOutput:
    """The result's content for the model and, when it has more than text, its artifact."""
    texts: list[str] = []
    kept: list[dict[str, Any]] = []
    for block in result.content:
        if block.type == "text":
            texts.append(block.text)
            continue
        texts.append(_line(block, len(kept)))
        kept.append(_kept(block.model_dump(mode="json", by_alias=True, exclude_none=True)))
    if result.is_error:
        raise ToolError("\n".join(texts) or "the MCP tool reported an error and gave no text")
    artifact: dict[str, Any] | None = {"mcp": {"content": kept}} if kept else None
    if result.structured_content is not None and not kept:
        return ToolOutput(result.structured_content, None)
    return ToolOutput("\n".join(texts), artifact)


def _line(block: Any, index: int) -> str:
    """What the model reads in place of a block it cannot read."""
    where = f"kept in the result's artifact as mcp.content[{index}]"
    if block.type in ("image", "audio"):
        size = len(block.data) * 3 // 4
        return f"[{block.type} {block.mime_type}, about {size:,} bytes: {where}]"
    if block.type == "resource":
        res = block.resource
        mime = f" ({res.mime_type})" if res.mime_type else ""
        return f"[resource {res.uri}{mime}: {where}]"
    if block.type == "resource_link":
        return f"[resource link {block.name}: {block.uri}]"
    return f"[{block.type} content: {where}]"


def _kept(dumped: dict[str, Any]) -> dict[str, Any]:
    """A block as stored, its payload dropped when it alone passes the run's stored-size cap."""
    for holder in (dumped, dumped.get("resource")):
        if not isinstance(holder, dict):
            continue
        for field in ("data", "blob", "text"):
            value = holder.get(field)
            if isinstance(value, str) and len(value) > DEFAULT_MAX_STORED_CHARS:
                holder[field] = None
                holder["dropped"] = f"{field}: {len(value):,} characters, over the stored-size cap"
    return dumped
