"""The capacity benchmark's tools: each waits, as agents' tools mostly do (an API, a database)."""

import asyncio
import time

from criogenai import tool


@tool(read_only=True)
async def wait_async(secs: float = 1.0) -> float:
    """Wait on the event loop, then return how long."""
    await asyncio.sleep(secs)
    return secs


@tool(read_only=True)
def wait_sync(secs: float = 1.0) -> float:
    """Wait on a thread, then return how long."""
    time.sleep(secs)
    return secs
