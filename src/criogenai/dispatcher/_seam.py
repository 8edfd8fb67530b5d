"""The one seam between a dispatcher and what runs its calls: the fleet engine (``_engine``:
Celery workers through a broker) or the embedded engine (``_inprocess``: this process)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Protocol

from .._wire import ToolResult
from ..store import Ledger
from ._admission import Send


class Gathered(dict[str, ToolResult]):
    """A turn's results by call id. The embedded engine adds the exceptions its tools raised
    (``causes``, by call id): they exist in this process, where a fleet can only describe them."""

    def __init__(self) -> None:
        super().__init__()
        self.causes: dict[str, BaseException] = {}


class Engine(Protocol):
    """What a dispatcher asks of an engine; everything else about running calls is the engine's."""

    ledger: Ledger
    """Where calls are claimed and results filed (Redis on a fleet; memory or Redis embedded)."""
    reply_to: str
    """The reply list carried in each call's task (the embedded engine answers directly)."""

    def submit(
        self,
        run_id: str,
        sends: list[Send],
        *,
        check_finished: bool,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> concurrent.futures.Future[dict[str, ToolResult]]:
        """Run a turn's calls; the future gives every call's result by call id, each within its
        bound (no worker, a dead worker, a lost result: each ends as a result). With
        ``check_finished``, calls already finished under the run are answered from the ledger.
        ``loop`` is the caller's event loop, where an engine that runs calls here runs them."""
        ...

    def cancel(self, run_id: str) -> None:
        """Cancel the run: calls not started never run; running ones are told to stop."""
        ...

    def close(self) -> None:
        """Stop the engine's threads at once; calls still in flight end with a result."""
        ...
