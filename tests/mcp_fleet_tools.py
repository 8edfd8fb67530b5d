"""What a worker serves in the MCP fleet tests: server-everything over stdio, as an MCP server
object found in the module like a tool; its client's messages go to $CRIOGENAI_TEST_MCP_LOG."""

from __future__ import annotations

import os
from pathlib import Path

from tests.mcp_servers import recorded_everything

everything = recorded_everything(Path(os.environ["CRIOGENAI_TEST_MCP_LOG"]))
