"""What the worker serves in the ``criogenai mcp serve`` tests: one tool per flag, JSON and text results."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from criogenai import ToolError, tool


@tool(read_only=True)
def get_lab_result(test_id: Annotated[str, Field(pattern=r"^LAB-\d{5}$")]) -> dict[str, object]:
    """Look up a lab result by its id."""
    return {"test_id": test_id, "status": "final", "hba1c": 5.4}


@tool(idempotent=True)
def schedule_visit(patient_ref: str, slot: str) -> str:
    """Book a visit (booking the same slot twice is as once)."""
    return f"booked {patient_ref} at {slot}"


@tool(destructive=True)
def send_message(patient_ref: str, text: str) -> str:
    """Send a message to a patient."""
    return f"sent to {patient_ref}: {text}"


@tool
def refund_order(order: str) -> str:
    """Refund an order (unmarked: not known to be safe to repeat)."""
    raise ToolError(f"order {order} was never paid")
