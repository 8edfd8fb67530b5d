"""MCP servers nobody here wrote, as the tests start them (installed by ``make setup``)."""

from __future__ import annotations

import json
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


def server_groups(log: Path) -> list[int]:
    """The process groups of the servers started behind ``log`` (one per session), still alive."""
    return [int(p) for p in Path(f"{log}.pid").read_text().split() if alive(int(p))]


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
