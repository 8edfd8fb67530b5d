"""The benchmark's tool: does nothing, so the figures measure the engine."""

from criogenai import tool


@tool(read_only=True)
def noop(i: int = 0) -> int:
    """Return i."""
    return i
