"""ToolContext: what the engine tells a tool about the call it is running."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Filled by criogenai for a parameter annotated ``ToolContext``; never part of the schema.

    ``call_id`` is the model's id for the call and stays the same on every retry of it: use it as an
    idempotency key for anything that sends or pays.
    """

    call_id: str
    """The model's id for this call; the same on every retry of it."""
    run_id: str
    """The run's id, as in the result, traces and audit records."""
    tool_name: str = ""
    attempt: int = 1
    """1 on the first run of this call, 2 on the first retry, and so on."""
    scope: str | None = None
    """Whose data the call may touch, as the application named it for the run (``run_turn(...,
    scope=)``, ``Agent.run(..., user=)``); None when it named none. The model cannot set it."""
    cancel_event: threading.Event | None = field(default=None, repr=False, compare=False)
    """Set by the worker when the call's turn is cancelled; read it through ``cancelled``."""

    @property
    def cancelled(self) -> bool:
        """True once the turn was cancelled: a long tool may check it and return early."""
        return self.cancel_event is not None and self.cancel_event.is_set()
