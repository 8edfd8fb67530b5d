"""``criogenai tools`` (the catalog and the live workers behind each tool) and ``criogenai result``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ._config import Settings

if TYPE_CHECKING:
    from .tools import ToolRegistry


def catalog_registry(names: list[str], wait_secs: float) -> ToolRegistry:
    """The named tools from the catalog, waiting up to ``wait_secs`` for workers to publish them."""
    from .store import Catalog
    from .tools._registry import catalog_registry as from_catalog

    catalog = Catalog.from_settings(Settings.from_env())
    catalog.wait_for(names, wait_secs)
    return from_catalog(catalog, names)


def _tools(args: argparse.Namespace) -> int:
    from .store import Catalog, describe_conflict, versions

    catalog = Catalog.from_settings(Settings.from_env())
    entries = catalog.read(args.names or None)
    conflicts = {n: es for n, es in entries.items() if len(versions(es)) > 1}
    if args.json:
        out: list[dict[str, Any]] = []
        for name, es in entries.items():
            e = es[0]
            out.append(
                {
                    "name": name,
                    "description": e.description,
                    "parameters": e.parameters,
                    "queue": e.queue,
                    "flags": e.flags,
                    "timeout_secs": e.timeout_secs,
                    "schema_hash": e.schema_hash,
                    "workers": [
                        {"worker": x.worker, "schema_hash": x.schema_hash, "queue": x.queue} for x in es
                    ],
                    "conflict": name in conflicts,
                }
            )
        print(json.dumps(out, indent=2))
    else:
        rows = [("TOOL", "QUEUE", "FLAGS", "SCHEMA", "WORKERS")]
        for name, es in entries.items():
            for version, workers in sorted(versions(es).items()):
                e = next(x for x in es if x.version == version)
                rows.append((name, e.queue, ",".join(e.flags) or "-", e.schema_hash, ", ".join(workers)))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
        if len(rows) == 1:
            print("(no live worker has published its tools)")
    for name, es in conflicts.items():
        print(f"warning: {describe_conflict(name, es)}", file=sys.stderr)
    missing = [n for n in args.names if n not in entries]
    if missing:
        print(f"warning: no live worker serves {', '.join(missing)}", file=sys.stderr)
    return 0


def _result(args: argparse.Namespace) -> int:
    from ._results import fetch_full

    try:
        text = fetch_full(args.run_id, args.call_id)
    except LookupError as exc:
        print(f"criogenai: {exc.args[0]}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    return 0


def add_fleet_parsers(sub: Any) -> None:
    """Add ``tools`` and ``result`` to the command's subparsers."""
    t = sub.add_parser("tools", help="list the tool catalog and the live workers behind each tool")
    t.add_argument("names", nargs="*", help="only these tools")
    t.add_argument("--json", action="store_true", help="print JSON")
    t.set_defaults(func=_tools)
    r = sub.add_parser("result", help="print the full text of a call's result, kept with its run")
    r.add_argument("run_id")
    r.add_argument("call_id")
    r.set_defaults(func=_result)
