"""ToolRegistry: the allowlist of tools by name; the only way a name from a model reaches code."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from ..store import Catalog, describe_conflict, versions
from ._mcp import MCPServer
from ._tool import Tool, remote_tool

if TYPE_CHECKING:
    from .._config import Settings


class ToolRegistry:
    """Tools by name. Duplicate names are refused; unknown names are simply absent.

    An MCP server among the tools stands for every tool it lists (``MCPServer.tools()``).
    """

    def __init__(self, tools: Iterable[Tool[..., Any] | MCPServer] = ()) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        self.servers: list[MCPServer] = []
        """The MCP servers whose tools were added."""
        for t in tools:
            self.add(t)

    def add(self, t: Tool[..., Any] | MCPServer) -> None:
        if isinstance(t, MCPServer):
            for each in t.tools():
                self.add(each)
            if t not in self.servers:
                self.servers.append(t)
            return
        if not isinstance(t, Tool):
            raise ConfigurationError(f"{t!r} is not a tool; decorate it with @tool")
        other = self._tools.get(t.name)
        if other is not None and other is not t:
            raise ConfigurationError(f"two different tools are named {t.name!r}")
        self._tools[t.name] = t

    def get(self, name: str) -> Tool[..., Any] | None:
        return self._tools.get(name) if isinstance(name, str) else None

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    @classmethod
    def from_catalog(cls, names: Sequence[str], settings: Settings | None = None) -> ToolRegistry:
        """Tools by name from the fleet's catalog, for an agent process without the tools' code.

        Each validates calls against the schema its live workers publish. ConfigurationError when
        a name has no live worker, or when live workers serve it with different schemas.
        """
        catalog = Catalog.from_settings(settings)
        try:
            return catalog_registry(catalog, names)
        finally:
            catalog.client.close()

    @classmethod
    def from_modules(cls, modules: Iterable[str]) -> ToolRegistry:
        """Import each module by dotted path and register every Tool (and every MCP server's tools)
        defined at its top level."""
        registry = cls()
        for path in modules:
            try:
                module = importlib.import_module(path)
            except ImportError as exc:
                raise ConfigurationError(f"cannot import tool module {path!r}: {exc}") from exc
            found = [v for v in vars(module).values() if isinstance(v, Tool | MCPServer)]
            if not found:
                raise ConfigurationError(f"tool module {path!r} defines no @tool and no MCP server")
            for t in found:
                registry.add(t)
        return registry


def catalog_registry(catalog: Catalog, names: Sequence[str]) -> ToolRegistry:
    """Tools from the live workers' definitions, for a dispatcher with no tool code.

    Raises ConfigurationError when a name has no live worker, or when its live workers serve
    it with different definitions (the message names the workers and the schema hashes).
    """
    wanted = list(dict.fromkeys(names))
    entries = catalog.read(wanted)
    missing = [n for n in wanted if n not in entries]
    if missing:
        raise ConfigurationError(
            f"no live worker serves {', '.join(map(repr, missing))} "
            f"(the catalog has: {', '.join(sorted(catalog.read())) or 'nothing'})"
        )
    problems = [describe_conflict(n, entries[n]) for n in wanted if len(versions(entries[n])) > 1]
    if problems:
        raise ConfigurationError("; ".join(problems) + ". Finish rolling the fleet out to one version.")
    return ToolRegistry(remote_tool(entries[name][0].definition) for name in wanted)
