"""ToolContext: what the engine tells a tool about the call it is running."""

from __future__ import annotations

from dataclasses import dataclass


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
