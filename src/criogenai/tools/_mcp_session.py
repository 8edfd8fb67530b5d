"""One live MCP session per server per process, held on the process's event loop.

The official SDK's ``Client`` is an async context manager whose task groups must be entered and
left by one task, so each session has an owner task on the process loop (``_loop``) that
enters it and waits to be told to close; calls, from any task on that loop, use it meanwhile. A
session that breaks (the server died, closed its end, or stopped answering pings after a call
ran out of time) is closed and forgotten: the next call starts a new one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import MCPServerError as MCPServerError

if TYPE_CHECKING:
    from mcp import Client

log = logging.getLogger(__name__)

CLOSE_SECS = 8.0
"""Bound on closing a session: the SDK gives a stdio server 2 s after its stdin closes, then
SIGTERM, then SIGKILL 2 s later."""

PING_SECS = 5.0
"""A session whose server does not answer a request this fast after a call ran out of time is replaced."""


def describe(exc: BaseException) -> str:
    """An exception as one line, a group of one (the SDK's task groups raise those) unwrapped."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Session:
    """A connected ``Client`` and the task that owns it."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.client: Client | None = None
        self.closed = False
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, make_client: Callable[[], Client], timeout_secs: float, label: str) -> Session:
        """Start the server (or connect to it) and finish the handshake within ``timeout_secs``."""
        session = cls(label)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session._task = asyncio.create_task(session._own(make_client(), ready), name=f"mcp {label}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout_secs)
        except TimeoutError:
            session._task.cancel()
            raise MCPServerError(
                f"MCP server {label} did not finish starting within {timeout_secs:g} s"
            ) from None
        except asyncio.CancelledError:
            session._task.cancel()
            raise
        except Exception as exc:
            raise MCPServerError(f"MCP server {label} could not be started: {describe(exc)}") from exc
        return session

    async def _own(self, client: Client, ready: asyncio.Future[None]) -> None:
        try:
            async with client:
                self.client = client
                if not ready.done():
                    ready.set_result(None)
                await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the session's end; whoever waits for it is told
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("MCP server %s: the session ended: %s", self.label, describe(exc))
        finally:
            self.closed = True
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: an unawaited failure is not worth a warning

    def close_soon(self) -> None:
        """Mark the session finished and let its owner close it (in the background)."""
        self.closed = True
        self._stop.set()

    async def aclose(self) -> None:
        self.close_soon()
        if self._task is not None:
            done, _ = await asyncio.wait([self._task], timeout=CLOSE_SECS)
            if not done:
                self._task.cancel()

    def check_soon(self) -> None:
        """After a call ran out of time or was cancelled: replace the session if the server is stuck."""
        if not self.closed:
            task = asyncio.get_running_loop().create_task(self._check())
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def _check(self) -> None:
        client = self.client
        if client is None:
            return
        try:
            async with asyncio.timeout(PING_SECS):
                # A small request every protocol version has (ping is gone from 2026-07-28 on).
                await client.list_tools(cache_mode="refresh")
        except Exception as exc:
            why = describe(exc)
            log.warning("MCP server %s did not answer (%s); its session is replaced", self.label, why)
            self.close_soon()


_background: set[asyncio.Task[Any]] = set()
