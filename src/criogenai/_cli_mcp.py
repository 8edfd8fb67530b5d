"""``criogenai mcp serve``: the fleet's tools to any MCP client, over stdio or streamable HTTP."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import sys
from typing import Any

from ._config import Settings
from ._errors import ConfigurationError


def _serve(args: argparse.Namespace) -> int:
    from ._mcp_serve import FleetServer, LiveRegistry, check_token

    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError("mcp serve needs the SDK: pip install 'criogenai[mcp]'") from exc
    settings = Settings.from_env()
    if settings.embedded:
        raise ConfigurationError("mcp serve exposes a fleet's tools: set CRIOGENAI_BROKER_URL=redis://...")
    token = None
    if args.transport == "http":
        token = check_token(args.host, args.token or settings.mcp_token)
    logging.basicConfig(level=args.loglevel.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .dispatcher import Dispatcher
    from .store import Catalog

    before, after = _hooks(args.hooks)
    catalog = Catalog.from_settings(settings)
    named = [*(args.tool or ()), *(args.approve or ())]
    if named:  # workers may still be starting: --approve must name a tool the fleet serves
        catalog.wait_for(named, args.wait)
    registry = LiveRegistry(catalog, args.tool or ())
    registry.refresh()
    with Dispatcher(
        registry,
        settings=settings,
        approve=args.approve or (),
        limits=_limits(args.limits),
        on_tool_exception=args.on_tool_exception,
        before_tool=before,
        after_tool=after,
    ) as dispatcher:
        server = FleetServer(dispatcher, registry)
        if args.transport == "stdio":
            asyncio.run(server.serve_stdio())
        else:
            asyncio.run(server.serve_http(args.host, args.port, token))
    return 0


def _limits(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"--limits must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigurationError("--limits must be a JSON object, as Limits(**...) takes")
    return value


def _hooks(module: str) -> tuple[list[Any], list[Any]]:
    """The ``before_tool`` and ``after_tool`` lists found at the top level of a module."""
    if not module:
        return [], []
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"--hooks {module}: {exc}") from None
    before, after = list(getattr(found, "before_tool", [])), list(getattr(found, "after_tool", []))
    if not (before or after):
        raise ConfigurationError(f"--hooks {module}: the module defines neither before_tool nor after_tool")
    return before, after


def add_mcp_parser(sub: Any) -> None:
    """Add ``mcp serve`` to the ``criogenai`` parser."""
    m = sub.add_parser("mcp", help="the fleet as an MCP server")
    msub = m.add_subparsers(dest="mcp_command", required=True)
    s = msub.add_parser(
        "serve",
        help="serve the tools the live workers publish to MCP clients",
        description="Serve the tools the live workers publish (the catalog) as MCP tools; each call "
        "runs on the fleet through a Dispatcher (validation, limits, hooks, approvals).",
    )
    s.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    s.add_argument("--host", default="127.0.0.1", help="HTTP: address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="HTTP: port (default 8000); the path is /mcp")
    s.add_argument(
        "--token",
        default="",
        help="HTTP: the bearer token clients must send; default $CRIOGENAI_MCP_TOKEN (prefer it: "
        "a flag shows in the process list). Required unless --host is a loopback address",
    )
    s.add_argument("--tool", action="append", metavar="NAME", help="serve only these tools (repeat)")
    s.add_argument("--approve", action="append", metavar="NAME", help="calls of this tool wait for a person")
    s.add_argument(
        "--limits", default="", metavar="JSON", help='Limits as JSON, e.g. {"tool_concurrency": {"x": 2}}'
    )
    s.add_argument(
        "--hooks", default="", metavar="MODULE", help="a module whose before_tool/after_tool lists apply"
    )
    s.add_argument(
        "--on-tool-exception",
        choices=("return_generic", "return_to_model"),
        default="return_generic",
        help="what a client reads when a tool raises (default: only that it failed)",
    )
    s.add_argument(
        "--wait", type=float, default=30.0, help="seconds to wait at start for the --tool/--approve tools"
    )
    s.add_argument("--loglevel", "-l", default="WARNING")
    s.set_defaults(func=_serve)
