"""Collections: documents chunked into a store (SQLite FTS5 or PostgreSQL), searched by keyword."""

from typing import TYPE_CHECKING, Any

from ._chunk import Format, chunk
from ._collection import Collection, format_passages
from ._model import Document, Passage, Store
from ._query import InvalidQuery
from ._sqlite import SQLiteStore

if TYPE_CHECKING:
    from ._postgres import PostgresStore


def __getattr__(name: str) -> Any:
    # PostgresStore needs the postgres extra; everything else works without it.
    if name == "PostgresStore":
        try:
            from ._postgres import PostgresStore
        except ImportError as exc:
            hint = "PostgresStore needs psycopg: pip install 'criogenai[postgres]'"
            raise ImportError(f"{hint} ({exc})") from exc
        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Collection",
    "Document",
    "Format",
    "InvalidQuery",
    "Passage",
    "PostgresStore",
    "SQLiteStore",
    "Store",
    "chunk",
    "format_passages",
]
