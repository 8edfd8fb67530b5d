"""What a collection stores and returns: documents in, passages out, and the store's interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from ._chunk import Format
from ._query import FilterValue


class Document(BaseModel):
    """One document to add: its text in a format, the source id it is replaced or removed by."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(min_length=1, max_length=1000)
    """The document's id in the collection (a path, URL or key): adding it again replaces it."""
    text: str
    format: Format = "text"
    metadata: dict[str, FilterValue] = Field(default_factory=dict)
    """Kept with every passage of the document and matched by ``search(filter=...)``."""


class Passage(BaseModel):
    """A chunk of a document that matched a query."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    position: int
    """The chunk's place in its document, from 0."""
    text: str
    score: float
    """Higher is more relevant; comparable only within one search."""
    metadata: dict[str, FilterValue] = Field(default_factory=dict)


class Chunk(BaseModel):
    """A passage as stored: what a store writes for a document."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    position: int
    text: str
    metadata: dict[str, FilterValue]


class Store(Protocol):
    """Where a collection's chunks live: SQLite (embedded) or PostgreSQL (a fleet)."""

    def replace(self, collection: str, sources: Sequence[str], chunks: Sequence[Chunk]) -> None:
        """Remove every chunk of ``sources``, then store ``chunks``, in one transaction."""
        ...

    def remove(self, collection: str, source: str) -> int:
        """Remove a source's chunks; how many there were."""
        ...

    def search(
        self, collection: str, words: list[str], limit: int, where: dict[str, FilterValue]
    ) -> list[Passage]:
        """The best ``limit`` chunks matching any of ``words`` (and every ``where`` pair), best first."""
        ...

    def count(self, collection: str) -> int:
        """How many chunks the collection holds."""
        ...

    def close(self) -> None: ...
