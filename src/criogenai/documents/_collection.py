"""Collection: named documents in a store, searched by keyword, and offered to a model as a tool."""

# No `from __future__ import annotations`: the tools' hints use local values (limits), which
# the schema builder must see at definition.
import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import Field

from .._errors import ConfigurationError
from ..tools import DEFAULT_QUEUE, Tool, tool
from ._chunk import DEFAULT_CHUNK_CHARS, Format, chunk
from ._model import Chunk, Document, Passage, Store
from ._query import QUERY_PATTERN, FilterValue, InvalidQuery, check_filter, terms

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,99}$")
MAX_LIMIT = 100
MAX_TOOL_QUERY_CHARS = 2000


class Collection:
    """Documents under ``name`` in ``store`` (an in-memory SQLite store by default).

    Documents are chunked when added (``chunk_chars`` each at most, about); adding a source again
    replaces its chunks; ``search`` ranks chunks by keyword relevance.
    """

    def __init__(
        self, name: str, store: Store | None = None, *, chunk_chars: int = DEFAULT_CHUNK_CHARS
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(f"collection name {name!r}: 1-100 letters, digits or '_.:-'")
        if chunk_chars < 100:
            raise ConfigurationError("chunk_chars must be at least 100")
        if store is None:
            from ._sqlite import SQLiteStore

            store = SQLiteStore()
        self.name = name
        self.store = store
        self.chunk_chars = chunk_chars

    def __repr__(self) -> str:
        return f"<Collection {self.name!r} in {self.store!r}>"

    def add(
        self,
        source: str,
        text: str,
        *,
        format: Format = "text",
        metadata: dict[str, FilterValue] | None = None,
    ) -> int:
        """Add (or replace) the document ``source``; returns how many chunks it became."""
        return self.add_many([Document(source=source, text=text, format=format, metadata=metadata or {})])

    def add_many(self, documents: Iterable[Document]) -> int:
        """Add (or replace) many documents in one transaction; returns how many chunks were stored."""
        docs = list(documents)
        for d in docs:
            check_filter(d.metadata)
        chunks = [
            Chunk(source=d.source, position=i, text=text, metadata=d.metadata)
            for d in docs
            for i, text in enumerate(chunk(d.text, d.format, self.chunk_chars))
        ]
        self.store.replace(self.name, list(dict.fromkeys(d.source for d in docs)), chunks)
        return len(chunks)

    def remove(self, source: str) -> int:
        """Remove a document; how many chunks it had (0: there was none)."""
        return self.store.remove(self.name, source)

    def count(self) -> int:
        """How many chunks the collection holds."""
        return self.store.count(self.name)

    def search(
        self, query: str, limit: int = 5, filter: dict[str, FilterValue] | None = None
    ) -> list[Passage]:
        """The ``limit`` passages most relevant to ``query``'s words, best first.

        The query is only words: punctuation, quotes and operators separate them and mean nothing
        else. ``filter`` keeps passages whose document metadata has every key with that value.
        Raises InvalidQuery when the query has no words or the filter is malformed.
        """
        if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidQuery(f"limit must be an integer from 1 to {MAX_LIMIT}")
        return self.store.search(self.name, terms(query), limit, check_filter(filter))

    def as_tool(
        self,
        name: str,
        description: str,
        *,
        limit: int = 5,
        filter: dict[str, FilterValue] | None = None,
        timeout_secs: float | None = None,
        queue: str = DEFAULT_QUEUE,
    ) -> Tool[..., Any]:
        """A read-only tool searching this collection: the model gives ``query`` (and ``limit``,
        at most ``limit``); the result lists passages with their sources, cut like any result.

        ``filter`` is the application's, fixed here: the model cannot widen it. On a fleet, define
        the collection and its tool at the top level of a module the workers serve, with a store
        they all reach (PostgresStore).
        """
        where = check_filter(filter)
        collection = self
        most = limit

        def search(
            query: Annotated[
                str,
                Field(
                    min_length=1,
                    max_length=MAX_TOOL_QUERY_CHARS,
                    pattern=QUERY_PATTERN,
                    description="Keywords to look for; passages with more of them (rarer ones count more) "
                    "rank first.",
                ),
            ],
            limit: Annotated[int, Field(ge=1, le=most, description="How many passages to return.")] = most,
        ) -> str:
            return format_passages(collection.search(query, limit, where))

        decorate = tool(
            name=name, description=description, read_only=True, timeout_secs=timeout_secs, queue=queue
        )
        return decorate(search)


def format_passages(passages: list[Passage]) -> str:
    """Passages as the model reads them: a numbered source line, then the text."""
    if not passages:
        return "No passage matches."
    return "\n\n".join(
        f"[{i}] {p.source} (part {p.position + 1}, score {p.score:.3g})\n{p.text}"
        for i, p in enumerate(passages, 1)
    )
