"""An MCP server's tools beside a @tool, in one turn (the README's MCP example).

Needs the mcp extra and mcp-server-time: pip install 'criogenai[mcp]' mcp-server-time
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from criogenai import Dispatcher, MCPServerStdio, ToolCall, tool

command = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")
time_server = MCPServerStdio(command, name="time", prefix="clock")  # tools: clock_get_current_time, ...


@tool(read_only=True)
def greet(name: str) -> str:
    """Say hello."""
    return f"Hello, {name}!"


with time_server, Dispatcher([greet, time_server]) as d:
    tool_ = d.registry.get("clock_get_current_time")
    assert tool_ is not None
    print(tool_.read_only, tool_.idempotent, tool_.destructive)  # True True False: from its annotations
    for r in d.run_turn_sync(
        [
            ToolCall(id="c1", name="clock_get_current_time", arguments={"timezone": "Europe/Lisbon"}),
            ToolCall(id="c2", name="clock_get_current_time", arguments={"timezone": "Mars/Olympus"}),
            ToolCall(id="c3", name="greet", arguments={"name": "Ana"}),
        ]
    ):
        print(r.call_id, r.status, r.content[:60].replace("\n", " "))
