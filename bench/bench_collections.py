"""Collections on SQLite FTS5 and PostgreSQL: add throughput, search throughput and latency.

For each size (chunks) and store: adds a generated corpus (``tests/corpus.py``: short documents of
one chunk each, Zipf-distributed pseudo-words) in batches of 1,000 documents through
``Collection.add_many``, then runs keyword queries with known answers (three of a document's
rarest words) one after another, timing each ``search(query, 5)`` with ``time.perf_counter``.
Reports chunks added per second, searches per second, p50/p99 latency and how often the right
document was in the top 5. SQLite is a file in a temporary directory; PostgreSQL a table of its
own, dropped at the end.

    python bench/bench_collections.py [--sizes 10000,100000] [--queries 300]
        [--postgres postgresql://postgres@127.0.0.1:5432/test] [--json bench/results/collections.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.corpus import documents, queries  # noqa: E402

from criogenai.documents import Collection, Document, PostgresStore, SQLiteStore, Store  # noqa: E402

BATCH = 1000


def run(store: Store, docs: list[str], asked: list[tuple[str, int]]) -> dict[str, Any]:
    c = Collection("bench", store)
    started = time.perf_counter()
    for i in range(0, len(docs), BATCH):
        c.add_many(Document(source=f"doc-{j}", text=docs[j]) for j in range(i, min(i + BATCH, len(docs))))
    add_secs = time.perf_counter() - started
    chunks = c.count()
    for q, _ in asked[:20]:  # warm caches
        c.search(q, 5)
    latencies, hits = [], 0
    for q, i in asked:
        t = time.perf_counter()
        found = c.search(q, 5)
        latencies.append(time.perf_counter() - t)
        hits += f"doc-{i}" in [p.source for p in found]
    latencies.sort()
    return {
        "chunks": chunks,
        "add_chunks_per_s": round(chunks / add_secs),
        "searches_per_s": round(len(latencies) / sum(latencies), 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 2),
        "top5_hit_rate": round(hits / len(asked), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for size in (int(s) for s in args.sizes.split(",")):
        docs = documents(size)
        asked = queries(docs, args.queries)
        with tempfile.TemporaryDirectory() as tmp:
            sqlite = SQLiteStore(str(Path(tmp) / "bench.db"))
            rows.append({"store": "sqlite", **run(sqlite, docs, asked)})
            sqlite.close()
        pg = PostgresStore(args.postgres, table=f"crg_bench_{uuid.uuid4().hex[:8]}")
        try:
            rows.append({"store": "postgres", **run(pg, docs, asked)})
        finally:
            pg.drop()
            pg.close()
        for r in rows[-2:]:
            print(f"{r['store']:<9}{r['chunks']:>8} chunks  add {r['add_chunks_per_s']:>7}/s  "
                  f"search {r['searches_per_s']:>7}/s  p50 {r['p50_ms']:>7} ms  p99 {r['p99_ms']:>7} ms  "
                  f"top-5 {r['top5_hit_rate']:.1%}", flush=True)
    if args.json:
        meta = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                "cpus": os.cpu_count()}
        Path(args.json).write_text(json.dumps({"meta": meta, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
