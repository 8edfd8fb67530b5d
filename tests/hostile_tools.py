"""Tools a hostile-input test's worker serves: results and checks a model's data can set off.

Each counts its real runs in the test's Redis (``tests.fleet_tools.runs``). They are on a queue of
their own, so the worker serving them takes no other module's calls.
"""

from __future__ import annotations

from pydantic import BaseModel, field_validator

from criogenai import ToolError, tool
from tests.fleet_tools import _count

QUEUE = "hostile-input"


class Item(BaseModel):
    name: str

    @field_validator("name")
    @classmethod
    def _checked(cls, value: str) -> str:
        if value == "boom":
            raise RuntimeError("SECRET-from-the-validator")  # not a ValueError: pydantic lets it through
        return value


@tool(queue=QUEUE)
def takes_item(item: Item, key: str) -> str:
    """Take an item (its validator has a bug a model can set off)."""
    _count(key)
    return item.name


@tool(queue=QUEUE)
def decoded_badly(key: str, how: str) -> object:
    """A result, a ToolError or an exception holding a lone surrogate, as a bad decode leaves."""
    _count(key)
    if how == "value":
        return {"text": "abc\ud800"}
    if how == "tool_error":
        raise ToolError("no such page: \ud800")
    raise ValueError("SECRET \udc80 in the text")
