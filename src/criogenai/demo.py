"""The Tools page's clinic tools, which ``criogenai demo`` runs: schedule_visit, get_lab_result, send_message.

Shipped in the package so that the demo runs from an installed wheel, and so that a worker can
serve them anywhere: ``criogenai worker --tools criogenai.demo``.
"""

from __future__ import annotations

import asyncio
from typing import List, Literal, Optional  # noqa: UP035 - written as the Tools page writes them

from pydantic import BaseModel

from ._errors import ToolError
from .tools import ToolContext, tool

SENT: dict[str, str] = {}


class Address(BaseModel):
    street: str
    city: str
    postcode: str


@tool
def schedule_visit(
    patient_ref: str,
    kind: Literal["home", "clinic", "video"],
    slots: List[str],  # noqa: UP006
    duration_minutes: int = 30,
    note: Optional[str] = None,  # noqa: UP045
    address: Optional[Address] = None,  # noqa: UP045
) -> dict[str, object]:
    """Book a visit in the first free slot. Slots are ISO 8601 times."""
    if not slots:
        raise ToolError("Give at least one slot")
    return {"booked": slots[0], "kind": kind, "minutes": duration_minutes}


def lab_system_is_down() -> bool:
    return False


@tool(read_only=True)
def get_lab_result(test_id: str) -> dict[str, str]:
    """Read one lab result by its id."""
    if not test_id.startswith("LAB-"):
        raise ToolError("Lab ids look like LAB-12345")
    if lab_system_is_down():
        raise ToolError("The lab system is not answering", retryable=True)
    return {"test_id": test_id, "status": "final"}


@tool(name="send_message", description="Send a message to the care team.", destructive=True)
async def send(text: str, ctx: ToolContext) -> str:
    # The call id is stable across retries: the outbox keys on it, so a repeat sends nothing twice.
    await asyncio.sleep(0)
    SENT.setdefault(ctx.call_id, text)
    return "sent"
