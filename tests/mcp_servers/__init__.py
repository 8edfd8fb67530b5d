"""MCP servers nobody here wrote, as the tests start them (installed by ``make setup``)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from criogenai import MCPServerStdio

ROOT = Path(__file__).resolve().parent.parent.parent
EVERYTHING = ROOT / "tests" / "node" / "node_modules" / ".bin" / "mcp-server-everything"
RECORDED = Path(__file__).resolve().parent / "recorded.sh"


def everything_command() -> str:
    """``@modelcontextprotocol/server-everything`` from npm, as installed into tests/node by make."""
    if not EVERYTHING.exists():
        raise AssertionError(f"{EVERYTHING} is missing: run `make setup` (npm ci in tests/node)")
    return str(EVERYTHING)


def time_command() -> str:
    """``mcp-server-time`` from PyPI (the dev extra), next to this interpreter."""
    found = Path(sys.executable).parent / "mcp-server-time"
    if found.exists():
        return str(found)
    which = shutil.which("mcp-server-time")
    if which is None:
        raise AssertionError("mcp-server-time is missing: pip install -e '.[dev]'")
    return which


def recorded_everything(log: Path, **options: object) -> MCPServerStdio:
    """server-everything over stdio, with every message its client sends appended to ``log``."""
    return MCPServerStdio(
        str(RECORDED),
        [str(log), everything_command(), "stdio"],
        name="everything",
        **options,  # type: ignore[arg-type]
    )


def sent(log: Path) -> list[dict[str, object]]:
    """The JSON-RPC messages the client sent, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def server_group(log: Path) -> int:
    """The process group of the server behind ``log`` (its session leader's pid)."""
    return int(Path(f"{log}.pid").read_text().strip())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
