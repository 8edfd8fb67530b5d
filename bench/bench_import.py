"""How long ``import criogenai`` takes: the median cumulative ``-X importtime`` of fresh interpreters.

Runs ``python -X importtime -c CODE`` N times, each in a new process with no ``CRIOGENAI_*``
variable set (so no broker). CODE is ``import criogenai`` unless ``--code`` says otherwise. A run's
time is the sum of the cumulative microseconds of its top-level ``criogenai*`` lines: the one of
``criogenai``, plus one per module a lazy name imports (``importlib.import_module`` is not logged
itself, so what it imports shows at the top level). Prints the median, min and max; ``--top K``
also prints the K slowest modules of the median run and the third-party packages it loaded.

``--src`` (repeatable) names the ``src`` directories to compare, e.g. this checkout's and main's;
their runs are interleaved, so that machine noise hits each alike. ``--pyc`` measures with bytecode
caches (in a temporary ``PYTHONPYCACHEPREFIX``, after one warm-up run), as an installed package is
imported; without it, criogenai's own modules are compiled on every run if
``PYTHONDONTWRITEBYTECODE`` is set.

    python bench/bench_import.py [--runs 15] [--top 25] [--pyc] [--json bench/results/import.json]
        [--code "from criogenai import Dispatcher, ToolCall, tool"] [--src A/src --src B/src]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Line = tuple[int, int, str]
"""One line of ``-X importtime``: self and cumulative microseconds, and the indented module name."""


def one_run(code: str, src: Path, pycache: str | None) -> tuple[int, list[Line]]:
    """One fresh interpreter: criogenai's total import time (us) and every line it logged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRIOGENAI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env, capture_output=True, text=True, check=True,
    )
    rows: list[Line] = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        rows.append((int(own), int(cumulative), name.rstrip()))
    total = sum(c for _, c, name in rows if name.startswith(" criogenai"))  # top level: one space
    return total, rows


def report(code: str, src: Path, runs: list[tuple[int, list[Line]]], top: int) -> dict[str, Any]:
    """Print the figures of one src directory's runs (and its slowest modules); return them."""
    runs = sorted(runs, key=lambda r: r[0])
    totals = [t / 1000 for t, _ in runs]
    figures = {"src": str(src), "code": code, "runs": len(runs), "median_ms": statistics.median(totals),
               "min_ms": totals[0], "max_ms": totals[-1]}
    print(f"{code}  [{src}]\n  median {figures['median_ms']:.1f} ms cumulative over {len(runs)} "
          f"fresh interpreters (min {totals[0]:.1f}, max {totals[-1]:.1f})")
    if not top:
        return figures
    _, rows = runs[len(runs) // 2]
    print(f"  slowest {top} of the median run (cumulative, self, ms):")
    for own, cumulative, name in sorted(rows, key=lambda r: r[1])[-top:][::-1]:
        print(f"  {cumulative / 1000:8.1f} {own / 1000:8.1f}  {name}")
    top_level = {name.strip().split(".")[0] for _, _, name in rows}
    ours = {"criogenai", "sitecustomize"}
    third_party = sorted(p for p in top_level - sys.stdlib_module_names - ours if not p.startswith("_"))
    print("  third-party packages loaded:", " ".join(third_party))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--top", type=int, default=0, help="print the K slowest modules of the median run")
    parser.add_argument("--code", default="import criogenai")
    parser.add_argument("--src", type=Path, action="append", help="a criogenai src directory (repeatable)")
    parser.add_argument("--pyc", action="store_true", help="with bytecode caches, as when installed")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    sources: list[Path] = args.src or [ROOT / "src"]

    with tempfile.TemporaryDirectory(prefix="bench-import-pyc-") as tmp:
        pycache = tmp if args.pyc else None
        if pycache is not None:
            for src in sources:
                one_run(args.code, src, pycache)  # writes the caches
        runs: dict[Path, list[tuple[int, list[Line]]]] = {src: [] for src in sources}
        for _ in range(args.runs):
            for src in sources:
                runs[src].append(one_run(args.code, src, pycache))
    figures = [report(args.code, src, runs[src], args.top) for src in sources]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pyc": args.pyc, "results": figures}, indent=2))


if __name__ == "__main__":
    main()
