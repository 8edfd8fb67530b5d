"""Collections on both stores: SQLite FTS5 (embedded) and PostgreSQL (a fleet's), same behaviour.

PostgreSQL is the server at CRIOGENAI_TEST_POSTGRES (default 127.0.0.1:5432, database ``test``);
each run uses tables of its own, dropped at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from criogenai.documents import Collection, Document, InvalidQuery, PostgresStore, SQLiteStore, Store
from tests.corpus import documents, queries

POSTGRES = os.environ.get("CRIOGENAI_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_store(table: str | None = None) -> PostgresStore:
    return PostgresStore(POSTGRES, table=table or f"crg_test_{uuid.uuid4().hex[:10]}")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "sqlite":
        s: Store = SQLiteStore()
        yield s
        s.close()
        return
    pg = postgres_store()
    yield pg
    pg.drop()
    pg.close()


def fresh(store: Store) -> Collection:
    return Collection(f"c{uuid.uuid4().hex[:8]}", store)


MARKDOWN = """# Lab results

A lab result is **final** once the pathologist signs it.

## Turnaround

Most panels come back within two days; cultures take five.
"""

HTML = """<html><head><title>x</title><style>p{color:red}</style>
<script>var secret = 1;</script></head><body><h1>Billing</h1><p>Invoices are sent monthly.</p>
<ul><li>Refunds within 30 days</li></ul></body></html>"""


def test_documents_of_each_format_are_chunked_and_found_with_source_and_position(store: Store) -> None:
    c = fresh(store)
    c.add("guide.md", MARKDOWN, format="markdown", metadata={"kind": "guide"})
    c.add("billing.html", HTML, format="html")
    c.add("notes.txt", "Plain notes.\n\nCultures are kept in the fridge.")

    hits = c.search("cultures turnaround", limit=5)
    assert hits[0].source == "guide.md"
    assert hits[0].position == 1  # the second section, under its own heading
    assert hits[0].text.startswith("Turnaround\n\n")
    assert "**" not in c.search("pathologist")[0].text  # markup is gone
    assert {h.source for h in hits} == {"guide.md", "notes.txt"}
    assert c.search("refunds")[0].source == "billing.html"
    assert c.search("secret var color red") == []  # scripts and styles are not text


def test_re_adding_a_source_replaces_it_and_remove_deletes_it(store: Store) -> None:
    c = fresh(store)
    c.add("a", "The walrus sleeps on the ice.")
    c.add("b", "Penguins sleep standing.")
    c.add("a", "Narwhals have tusks.")
    assert c.count() == 2
    assert c.search("walrus ice") == []
    assert c.search("narwhals")[0].source == "a"
    assert c.remove("a") == 1
    assert c.remove("a") == 0
    assert c.search("narwhals tusks") == []
    assert [p.source for p in c.search("penguins")] == ["b"]


def test_long_documents_become_bounded_chunks_in_order(store: Store) -> None:
    c = Collection(f"c{uuid.uuid4().hex[:8]}", store, chunk_chars=300)
    paragraphs = [f"Paragraph {i} talks about topic{i} at some length. " * 3 for i in range(20)]
    n = c.add("long", "\n\n".join(paragraphs))
    assert n > 5
    hits = c.search("topic17", limit=1)
    assert "topic17" in hits[0].text and len(hits[0].text) <= 300
    assert c.search("topic0", limit=1)[0].position == 0
    assert hits[0].position == n - 1 or hits[0].position >= n // 2


def test_filters_keep_only_passages_whose_metadata_match(store: Store) -> None:
    c = fresh(store)
    c.add_many([
        Document(source="en", text="Opening hours are nine to five.", metadata={"lang": "en", "v": 2}),
        Document(source="old", text="Opening hours were eight to four.", metadata={"lang": "en", "v": 1}),
        Document(source="fr", text="Opening hours: neuf à cinq.", metadata={"lang": "fr", "public": True}),
    ])
    assert {p.source for p in c.search("opening hours", filter={"lang": "en"})} == {"en", "old"}
    assert [p.source for p in c.search("opening", filter={"lang": "en", "v": 2})] == ["en"]
    assert [p.source for p in c.search("opening", filter={"public": True})] == ["fr"]
    assert c.search("opening", filter={"lang": "de"}) == []
    assert c.search("opening", filter={"lang": "en"})[0].metadata["lang"] == "en"
    for bad in ({"a'b": 1}, {"lang": ["en"]}, {"": "x"}):
        with pytest.raises(InvalidQuery):
            c.search("opening", filter=bad)  # type: ignore[arg-type]


HOSTILE = [
    "hours'; DROP TABLE criogenai_chunks; --",
    "hours\" OR 1=1 --",
    "hours' OR '1'='1",
    "NEAR(opening hours) AND NOT x* ^y",
    "opening -hours | !(a & b) <-> c:* {x} [y]",
    "opening\x00hours",
    "\\'\\\"\\\\ opening",
    "🙂 opening 🙂 \u202e hours",
    "opening " + "hours " * 2000,  # 12,000 characters
    "x" * 10_000 + " opening",
    "hours) ; SELECT pg_sleep(10); --",
]


def test_hostile_queries_are_only_words_ranked_never_sql_or_driver_errors(store: Store) -> None:
    c = fresh(store)
    c.add("hours", "Opening hours are nine to five.")
    c.add("other", "Cultures take five days.")
    for q in HOSTILE:
        hits = c.search(q, limit=3)  # each holds "opening" or "hours" among its syntax
        assert hits and hits[0].source == "hours", q[:40]
    for q in ["", "   ", "'; --", "\x00", "\"\"", "*", "x" * 10_000, "!@#$%^&*()"]:
        with pytest.raises(InvalidQuery, match="no words"):
            c.search(q)
    assert c.count() == 2  # nothing was dropped or changed
    assert c.search("opening")[0].source == "hours"
    with pytest.raises(InvalidQuery, match="limit"):
        c.search("opening", limit=0)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return documents(2000)


def test_a_2000_document_corpus_puts_the_right_document_in_the_top_5_for_90_percent(
    store: Store, corpus: list[str]
) -> None:
    c = fresh(store)
    c.add_many(Document(source=f"doc-{i}", text=t) for i, t in enumerate(corpus))
    assert c.count() == 2000
    asked = queries(corpus, 300)
    found = sum(f"doc-{i}" in [p.source for p in c.search(q, limit=5)] for q, i in asked)
    assert found / len(asked) >= 0.9, found


def test_both_stores_give_the_same_top_results_for_keyword_queries(corpus: list[str]) -> None:
    sqlite = Collection("parity", SQLiteStore())
    pg_store = postgres_store()
    try:
        pg = Collection("parity", pg_store)
        docs = [Document(source=f"doc-{i}", text=t) for i, t in enumerate(corpus)]
        sqlite.add_many(docs)
        pg.add_many(docs)
        asked = queries(corpus, 200, seed=7)
        same_first = sum(sqlite.search(q, 1)[0].source == pg.search(q, 1)[0].source for q, _ in asked)
        assert same_first / len(asked) >= 0.9, same_first
    finally:
        pg_store.drop()
        pg_store.close()
