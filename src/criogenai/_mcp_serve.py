"""``criogenai mcp serve``: the fleet's tools, as the live workers publish them, as an MCP server.

Built on the official SDK's low-level ``Server`` (stdio, or streamable HTTP under uvicorn). Each
``tools/list`` reads the catalog again; each ``tools/call`` is a turn of one call through a
``Dispatcher`` (validation, fleet-wide limits, hooks, approvals), its ``ToolResult`` mapped back:

- ``ok`` → the content as text (``structuredContent`` too when it is a JSON object);
  ``pending_approval`` → a result that is not an error, naming the run and the call;
- every other status (``invalid_arguments`` included) → ``isError: true`` with the text the model
  would read: the spec files input validation under tool execution errors, so that a model can
  correct its call; ``unknown_tool`` → JSON-RPC error -32602, as the spec's own example;
- ``_meta`` of every result: ``criogenai/status``, ``criogenai/run_id``, ``criogenai/call_id``.
  A call sent with ``_meta["criogenai/run_id"]`` resumes that run (after an approval was decided).

HTTP takes a bearer token (``$CRIOGENAI_MCP_TOKEN`` or ``--token``; required unless bound to a
loopback address), checked by the SDK's bearer middleware; the token is never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._config import env_name
from ._errors import ConfigurationError
from .store import Catalog, describe_conflict, versions
from .tools import ToolRegistry
from .tools._tool import remote_tool

if TYPE_CHECKING:
    import mcp_types
    from mcp.server import Server, ServerRequestContext
    from mcp.server.auth.provider import AccessToken

    from ._wire import ToolResult
    from .dispatcher import Dispatcher
    from .tools import Tool

log = logging.getLogger(__name__)

TOKEN_ENV = env_name("mcp_token")
"""Where the bearer token comes from unless ``--token`` gives it (``Settings.mcp_token``)."""
MIN_TOKEN_CHARS = 16
CALL_ID = "mcp-call"
"""Each ``tools/call`` is a run of its own with one call, always this id (so a run can be resumed)."""
META = "criogenai/"
REFRESH_SECS = 1.0
"""A call to a name the server does not know reads the catalog again, at most this often."""
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_NOT_ERRORS = frozenset({"ok", "pending_approval"})


class LiveRegistry(ToolRegistry):
    """The catalog's tools (all, or the ``only`` names), read again on ``refresh``.

    A tool whose live workers serve different definitions is left out (with a warning) until the
    fleet agrees again, rather than guessing which definition a call would meet.
    """

    def __init__(self, catalog: Catalog, only: Sequence[str] = ()) -> None:
        super().__init__()
        self.catalog = catalog
        self.only = list(dict.fromkeys(only))
        self._read_at = -REFRESH_SECS

    def refresh(self) -> list[Tool[..., Any]]:
        entries = self.catalog.read(self.only or None)
        tools: dict[str, Tool[..., Any]] = {}
        for name, es in entries.items():
            if len(versions(es)) > 1:
                log.warning("mcp serve: %s; left out of the list", describe_conflict(name, es))
                continue
            old = self._tools.get(name)
            new = es[0].definition
            tools[name] = old if old is not None and old.definition == new else remote_tool(new)
        self._tools = tools  # one assignment: a reader sees the old set or the new one
        self._read_at = time.monotonic()
        return list(tools.values())

    def refresh_if_stale(self) -> None:
        if time.monotonic() - self._read_at >= REFRESH_SECS:
            self.refresh()


def as_mcp_tool(t: Tool[..., Any]) -> mcp_types.Tool:
    """A criogenai tool as MCP lists it. A tool with no flag gets no ``destructiveHint``: MCP's
    default (true) then applies, since nothing says the tool is safe to run."""
    import mcp_types

    hints = mcp_types.ToolAnnotations(
        read_only_hint=t.read_only,
        idempotent_hint=True if t.idempotent else None,
        destructive_hint=True if t.destructive else None,
    )
    return mcp_types.Tool(name=t.name, description=t.description, input_schema=t.schema, annotations=hints)


def as_mcp_result(r: ToolResult) -> mcp_types.CallToolResult:
    """A ``ToolResult`` as MCP's: its text, JSON objects as ``structuredContent`` too."""
    import json

    import mcp_types

    text = r.content
    if r.status == "pending_approval":
        text = (
            f"Waiting for approval: run {r.run_id}, call {r.call_id} (tool {r.name!r}) has not run. "
            f"A person decides with `criogenai approvals approve {r.run_id} {r.call_id}` (or reject); "
            f"then call the tool again with _meta {{\"{META}run_id\": \"{r.run_id}\"}} to resume."
        )
    structured: Any = None
    if r.status == "ok" and not r.truncated and text.startswith("{"):
        try:
            structured = json.loads(text)
        except (ValueError, RecursionError):  # a text, or JSON nested past what Python parses
            structured = None
        if not isinstance(structured, dict):
            structured = None
    meta = {f"{META}status": r.status, f"{META}run_id": r.run_id, f"{META}call_id": r.call_id}
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=r.status not in _NOT_ERRORS,
        meta=meta,
    )


@dataclass
class FleetServer:
    """The MCP server in front of one dispatcher whose registry is the live catalog."""

    dispatcher: Dispatcher
    registry: LiveRegistry
    name: str = "criogenai"
    _server: Server[Any] | None = field(default=None, init=False)

    @property
    def server(self) -> Server[Any]:
        from mcp.server import Server

        from ._version import __version__

        if self._server is None:
            self._server = Server(
                self.name,
                version=__version__,
                instructions="Tools of a criogenai worker fleet; each call runs on a worker.",
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
            )
        return self._server

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        import mcp_types

        tools = await asyncio.to_thread(self.registry.refresh)
        return mcp_types.ListToolsResult(tools=[as_mcp_tool(t) for t in sorted(tools, key=lambda t: t.name)])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        from mcp.shared.exceptions import MCPError
        from mcp_types import INVALID_PARAMS

        from ._wire import ToolCall

        if params.name not in self.registry:  # a tool a worker started serving since the last list
            await asyncio.to_thread(self.registry.refresh_if_stale)
        resume = (params.meta or {}).get(f"{META}run_id")
        if resume is not None and not (isinstance(resume, str) and _RUN_ID.match(resume)):
            why = f"_meta {META}run_id must be a run id this server gave, not {resume!r}"
            raise MCPError(INVALID_PARAMS, why)
        run_id = resume or uuid.uuid4().hex
        call = ToolCall(id=CALL_ID, name=params.name, arguments=params.arguments or {})
        (result,) = await self.dispatcher.run_turn([call], run_id=run_id)
        # The name is the client's (any length, any character): quoted and cut, one line whatever it holds.
        log.info("mcp serve: %r run=%s -> %s", params.name[:64], run_id, result.status)
        if result.status == "unknown_tool":
            raise MCPError(INVALID_PARAMS, result.content)
        return as_mcp_result(result)

    async def serve_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

    async def serve_http(self, host: str, port: int, token: str | None) -> None:
        import uvicorn
        from mcp.server.auth.settings import AuthSettings

        verifier = _BearerToken(token) if token else None
        # The SDK's bearer middleware comes with auth settings; no OAuth routes are served here.
        here = f"http://{_netloc(host, port)}"
        auth = AuthSettings(issuer_url=here, resource_server_url=None) if token else None
        app = self.server.streamable_http_app(host=host, auth=auth, token_verifier=verifier)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        log.info("mcp serve: streamable HTTP on http://%s/mcp (bearer token %s)",
                 _netloc(host, port), "required" if token else "off: loopback only")
        await uvicorn.Server(config).serve()


class _BearerToken:
    """The SDK's ``TokenVerifier`` for one static token, compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def __repr__(self) -> str:
        return "<bearer token>"  # never the token

    async def verify_token(self, token: str) -> AccessToken | None:
        from mcp.server.auth.provider import AccessToken

        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token="<bearer>", client_id="bearer", scopes=[])
        return None


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(host: str, token: str | None) -> str | None:
    """The token HTTP mode will require, or None (loopback only). ConfigurationError otherwise."""
    token = token or None
    if token is None and not is_loopback(host):
        raise ConfigurationError(
            f"mcp serve on {host} (not loopback) needs a bearer token: set ${TOKEN_ENV} (or --token)"
        )
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigurationError(f"the bearer token must have at least {MIN_TOKEN_CHARS} characters")
    return token
