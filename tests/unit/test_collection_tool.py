"""``collection.as_tool`` on the embedded engine: a read-only search tool the model calls."""

from __future__ import annotations

import json

from criogenai import Dispatcher, Settings, ToolCall
from criogenai.documents import Collection, SQLiteStore


def handbook() -> Collection:
    c = Collection("handbook", SQLiteStore())
    c.add("refunds.md", "# Refunds\n\nRefunds are paid within 30 days of a cancelled visit.",
          format="markdown", metadata={"audience": "patients"})
    c.add("staff.md", "# Refunds for staff\n\nStaff refunds need a manager's signature.", format="markdown",
          metadata={"audience": "staff"})
    c.add("hours.html", "<h1>Hours</h1><p>The clinic opens at eight.</p>", format="html",
          metadata={"audience": "patients"})
    return c


def test_the_tool_is_read_only_and_lists_passages_with_their_sources() -> None:
    search = handbook().as_tool("search_handbook", "Search the clinic handbook.", limit=3)
    assert search.read_only and search.retryable
    assert search.schema["properties"]["limit"]["maximum"] == 3
    with Dispatcher([search], settings=Settings()) as d:
        call = ToolCall(id="c", name="search_handbook", arguments={"query": "refunds cancelled"})
        [r] = d.run_turn_sync([call])
    assert r.status == "ok"
    assert r.content.startswith("[1] refunds.md (part 1, score ")
    assert "Refunds are paid within 30 days" in r.content and "[2] staff.md" in r.content


def test_the_applications_filter_holds_whatever_the_model_asks() -> None:
    search = handbook().as_tool("search_handbook", "Search.", filter={"audience": "patients"})
    with Dispatcher([search], settings=Settings()) as d:
        results = d.run_turn_sync([
            ToolCall(id="a", name="search_handbook", arguments={"query": "staff refunds manager"}),
            ToolCall(id="b", name="search_handbook",
                     arguments={"query": "manager", "filter": {"audience": "staff"}}),
        ])
    assert results[0].status == "ok" and "staff.md" not in results[0].content
    assert results[1].status == "invalid_arguments" and "'filter' was unexpected" in results[1].content


def test_hostile_queries_are_ranked_or_refused_as_invalid_arguments() -> None:
    search = handbook().as_tool("search_handbook", "Search.")
    calls = {
        "sql": "refunds'; DROP TABLE criogenai_chunks; --",
        "nul": "refunds\x00hours",
        "ops": "NEAR(refunds) OR \"hours",
        "empty": "",
        "punct": "'; -- */",
        "long": "refunds " * 1250,
        "nomatch": "zebra",
    }
    with Dispatcher([search], settings=Settings()) as d:
        results = d.run_turn_sync([ToolCall(id=k, name="search_handbook", arguments={"query": q})
                                   for k, q in calls.items()])
    by = {r.call_id: r for r in results}
    for k in ("sql", "nul", "ops"):
        assert by[k].status == "ok" and by[k].content.startswith("[1] "), k
    for k in ("empty", "punct", "long"):
        assert by[k].status == "invalid_arguments", k
    assert "query" in by["long"].content
    assert by["nomatch"].content == "No passage matches."


def test_a_long_result_is_cut_like_any_result() -> None:
    c = Collection("big", SQLiteStore())
    for i in range(10):
        c.add(f"doc{i}", "needle " + "hay " * 200)
    search = c.as_tool("search_big", "Search.", limit=10)
    with Dispatcher([search], settings=Settings(), limits={"max_result_chars": 500}) as d:
        [r] = d.run_turn_sync([ToolCall(id="c", name="search_big", arguments={"query": "needle"})])
    assert r.status == "ok" and r.truncated and len(r.content) <= 600
    assert json.dumps(r.artifact or {}).count("doc") >= 10  # the full text is kept with the run
