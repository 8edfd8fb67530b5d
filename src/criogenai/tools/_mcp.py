"""MCP servers in ``tools=``: each of a server's tools becomes a criogenai ``Tool``.

Built on the official SDK (``pip install 'criogenai[mcp]'``). A tool's name is the server's (or
``prefix_`` + it), its description and ``inputSchema`` are the server's (checked with
``check_schema`` under the draft its ``$schema`` names), and its flags come from the annotations:

- ``readOnlyHint: true`` → ``read_only``; ``idempotentHint: true`` → ``idempotent``;
- otherwise ``destructive`` unless ``destructiveHint: false`` (MCP's own default is true), so a
  tool without annotations is destructive and never retried. Our flags make destructive exclusive,
  so a tool hinted both destructive and idempotent is ``idempotent`` (doing it twice is as once).

``trust_annotations=False`` ignores the hints (the spec warns they are untrusted): every tool is
then destructive. Calls run in the process that holds the session (the dispatcher's when
embedded, a worker's on a fleet), one session per server per process, on the process loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import sys
import threading
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, TypeVar
from urllib.parse import urlsplit

from .._errors import ConfigurationError, ToolDefinitionError, ToolError
from .._keys import DEFAULT_QUEUE
from ._content import ToolOutput
from ._mcp_results import to_output
from ._mcp_session import CLOSE_SECS, MCPServerError, Session, describe
from ._tool import Tool

if TYPE_CHECKING:
    import mcp_types
    from mcp import Client

log = logging.getLogger(__name__)

T = TypeVar("T")

LIST_SECS = 30.0
"""Bound on listing a server's tools, every page, once its session is up."""

_MAX_PAGES = 100

_INSTALL_HINT = "MCP servers need the SDK: pip install 'criogenai[mcp]'"


@dataclass
class _ProcessState:
    """What one process holds for a server: its session, made on that process's loop."""

    session: Session | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class MCPServer:
    """An MCP server whose tools are passed in ``tools=`` (the two transports subclass it)."""

    def __init__(
        self,
        *,
        name: str,
        prefix: str | None,
        timeout_secs: float | None,
        queue: str,
        connect_timeout_secs: float,
        trust_annotations: bool,
    ) -> None:
        if not connect_timeout_secs > 0:
            raise ConfigurationError(f"connect_timeout_secs must be > 0, not {connect_timeout_secs}")
        try:
            import mcp  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(_INSTALL_HINT) from exc
        self.name = name
        self.prefix = prefix
        self.timeout_secs = timeout_secs
        self.queue = queue
        self.connect_timeout_secs = connect_timeout_secs
        self.trust_annotations = trust_annotations
        self._states: dict[int, _ProcessState] = {}
        self._listed: list[Tool[..., Any]] | None = None
        self._changes = self._listed_at = 0  # list_changed notifications seen; when last listed
        self._list_lock = threading.Lock()
        _servers.add(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def _make_client(self) -> Client:
        raise NotImplementedError

    # -- the tools ---------------------------------------------------------------------------------

    def tools(self) -> list[Tool[..., Any]]:
        """The server's tools as criogenai tools, listed once (again after the server says its
        list changed). A tool whose name or schema cannot be used is left out, with a warning."""
        with self._list_lock:
            if self._listed is None or self._listed_at != self._changes:
                self._listed_at = self._changes
                bound = self.connect_timeout_secs + LIST_SECS
                listed = _on_loop(self._list(), bound, f"listing the tools of MCP server {self.name}")
                self._listed = [t for t in (self._as_tool(d) for d in listed) if t is not None]
            return list(self._listed)

    async def _list(self) -> list[mcp_types.Tool]:
        session = await self._session()
        assert session.client is not None
        found: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(LIST_SECS):
                for _ in range(_MAX_PAGES):
                    page = await session.client.list_tools(cursor=cursor, cache_mode="refresh")
                    found.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except Exception as exc:
            session.close_soon()
            raise MCPServerError(f"MCP server {self.name} could not list its tools: {describe(exc)}") from exc
        return found

    def _as_tool(self, d: mcp_types.Tool) -> Tool[..., Any] | None:
        name = f"{self.prefix}_{d.name}" if self.prefix else d.name
        hints = d.annotations if self.trust_annotations else None
        read_only = bool(hints and hints.read_only_hint)
        idempotent = bool(hints and hints.idempotent_hint)
        destructive = not (read_only or idempotent) and not (hints and hints.destructive_hint is False)
        remote = d.name

        async def call(**arguments: Any) -> ToolOutput:
            return await self.call(remote, arguments)

        try:
            return Tool(
                call,
                name=name,
                description=d.description or (hints.title if hints and hints.title else "") or "",
                parameters=d.input_schema,
                model=None,
                context_param=None,
                read_only=read_only,
                idempotent=idempotent,
                destructive=destructive,
                timeout_secs=self.timeout_secs,
                queue=self.queue,
            )
        except ToolDefinitionError as exc:
            log.warning("MCP server %s: its tool %r is left out: %s", self.name, d.name, exc)
            return None

    # -- calls -------------------------------------------------------------------------------------

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> ToolOutput:
        """Call one of the server's tools by its MCP name, on this process's session."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        session = await self._session()
        assert session.client is not None
        try:
            result = await session.client.call_tool(tool_name, arguments)
        except asyncio.CancelledError:  # its time limit or a cancel: the SDK told the server
            session.check_soon()
            raise
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                session.close_soon()
                raise MCPServerError(
                    f"MCP server {self.name} closed the connection during the call; "
                    "the next call starts a new session"
                ) from None
            refused = f"the MCP server refused the call: {exc.error.message} (error {exc.code})"
            raise ToolError(refused) from None
        except Exception as exc:
            session.close_soon()
            raise MCPServerError(
                f"MCP server {self.name} failed during the call ({describe(exc)}); "
                "the next call starts a new session"
            ) from None
        return to_output(result)

    async def _session(self) -> Session:
        state = self._states.get(os.getpid())
        if state is None:  # a new process (a prefork child): the parent's session is not ours
            state = self._states.setdefault(os.getpid(), _ProcessState())
        async with state.lock:
            if state.session is None or state.session.closed:
                state.session = await Session.open(self._make_client, self.connect_timeout_secs, self.name)
            return state.session

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            log.info("MCP server %s changed its tools; the next registry lists them again", self.name)
            self._changes += 1  # no lock: this runs on the loop, maybe while tools() waits for a listing

    # -- closing -----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """End this process's session with the server (a stdio server's process ends with it)."""
        state = self._states.get(os.getpid())
        if state is not None and state.session is not None:
            session, state.session = state.session, None
            await session.aclose()

    def close(self) -> None:
        """``aclose`` from sync code (not from the process loop itself)."""
        state = self._states.get(os.getpid())
        if state is not None and state.session is not None:
            _on_loop(self.aclose(), CLOSE_SECS + 2, f"closing MCP server {self.name}")

    def __enter__(self) -> MCPServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MCPServerStdio(MCPServer):
    """An MCP server run as a subprocess, spoken to over its stdin and stdout.

    ``env`` is added to a minimal environment (the SDK passes on only ``HOME``, ``PATH`` and a few
    more), so the server sees none of this process's secrets unless given them here.
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name: str | None = None,
        prefix: str | None = None,
        timeout_secs: float | None = None,
        queue: str = DEFAULT_QUEUE,
        connect_timeout_secs: float = 20.0,
        trust_annotations: bool = True,
    ) -> None:
        super().__init__(
            name=name or os.path.basename(command),
            prefix=prefix,
            timeout_secs=timeout_secs,
            queue=queue,
            connect_timeout_secs=connect_timeout_secs,
            trust_annotations=trust_annotations,
        )
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd

    def _make_client(self) -> Client:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
        return Client(stdio_client(params, errlog=_errlog()), message_handler=self._on_message)


class MCPServerStreamableHTTP(MCPServer):
    """An MCP server at a URL, over streamable HTTP. ``headers`` (auth) are sent with every
    request and never logged or shown: only the URL's scheme, host and path are."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        prefix: str | None = None,
        timeout_secs: float | None = None,
        queue: str = DEFAULT_QUEUE,
        connect_timeout_secs: float = 20.0,
        trust_annotations: bool = True,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"MCP server URL must be http(s)://host/..., not {parts.scheme!r}")
        shown = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
        super().__init__(
            name=name or shown,
            prefix=prefix,
            timeout_secs=timeout_secs,
            queue=queue,
            connect_timeout_secs=connect_timeout_secs,
            trust_annotations=trust_annotations,
        )
        self.url = url
        self._headers = dict(headers or {})

    def _make_client(self) -> Client:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=self._headers, timeout=httpx2.Timeout(30.0, read=None))
        return Client(streamable_http_client(self.url, http_client=http), message_handler=self._on_message)


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: this process's own (Celery may have replaced
    ``sys.stderr`` by a logger, which has no file descriptor), else nowhere."""
    err = sys.__stderr__
    try:
        if err is not None:
            err.fileno()
            return err
    except (OSError, ValueError):
        pass
    return open(os.devnull, "w")


def _on_loop(coro: Coroutine[Any, Any, T], timeout: float, what: str) -> T:
    """Run ``coro`` on the process loop from sync code, within ``timeout``."""
    from .._loop import ProcessLoop

    loop = ProcessLoop.get()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError(f"{what}: not from the process loop's own thread")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise MCPServerError(f"{what} took longer than {timeout:g} s") from None


_servers: weakref.WeakSet[MCPServer] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At exit, end this process's sessions (a stdio server is told, then stopped) within a bound."""
    for server in list(_servers):
        try:
            server.close()
        except Exception as exc:  # exiting anyway
            log.debug("closing %r at exit: %s", server, describe(exc))
