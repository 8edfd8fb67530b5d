"""SQLiteStore: a collection's chunks in SQLite with an FTS5 index, in a file or in memory.

The embedded default. The FTS5 table indexes a plain table (external content, kept in step by
triggers) with the Porter stemmer, and ranks with FTS5's BM25. One connection, behind a lock:
tools run on threads.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Sequence

from .._errors import ConfigurationError
from ._model import Chunk, Passage
from ._query import FilterValue, quoted_or

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,50}$")


def check_table(table: str) -> str:
    if not _IDENT.match(table):
        raise ConfigurationError(f"table {table!r}: use letters, digits and '_' (at most 51)")
    return table


class SQLiteStore:
    """Chunks in ``path`` (``":memory:"`` by default), tables ``<table>`` and ``<table>_fts``."""

    def __init__(self, path: str = ":memory:", *, table: str = "criogenai_chunks") -> None:
        self.path = path
        self.table = check_table(table)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        t = self.table
        with self._lock:
            self._db.executescript(f"""
                PRAGMA journal_mode=WAL;
                CREATE TABLE IF NOT EXISTS {t} (
                    id INTEGER PRIMARY KEY, collection TEXT NOT NULL, source TEXT NOT NULL,
                    position INTEGER NOT NULL, text TEXT NOT NULL, metadata TEXT NOT NULL);
                CREATE INDEX IF NOT EXISTS {t}_source ON {t} (collection, source);
                CREATE VIRTUAL TABLE IF NOT EXISTS {t}_fts USING fts5(
                    text, content='{t}', content_rowid='id', tokenize='porter unicode61');
                CREATE TRIGGER IF NOT EXISTS {t}_ai AFTER INSERT ON {t} BEGIN
                    INSERT INTO {t}_fts (rowid, text) VALUES (new.id, new.text); END;
                CREATE TRIGGER IF NOT EXISTS {t}_ad AFTER DELETE ON {t} BEGIN
                    INSERT INTO {t}_fts ({t}_fts, rowid, text) VALUES ('delete', old.id, old.text); END;
            """)

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r} table={self.table!r}>"

    def replace(self, collection: str, sources: Sequence[str], chunks: Sequence[Chunk]) -> None:
        t = self.table
        rows = [(collection, c.source, c.position, c.text, json.dumps(c.metadata)) for c in chunks]
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    f"DELETE FROM {t} WHERE collection = ? AND source = ?", [(collection, s) for s in sources]
                )
                self._db.executemany(
                    f"INSERT INTO {t} (collection, source, position, text, metadata) VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def remove(self, collection: str, source: str) -> int:
        with self._lock:
            cur = self._db.execute(
                f"DELETE FROM {self.table} WHERE collection = ? AND source = ?", (collection, source)
            )
            return cur.rowcount

    def search(
        self, collection: str, words: list[str], limit: int, where: dict[str, FilterValue]
    ) -> list[Passage]:
        t = self.table
        sql = (
            f"SELECT c.source, c.position, c.text, c.metadata, bm25({t}_fts) AS s "
            f"FROM {t}_fts JOIN {t} c ON c.id = {t}_fts.rowid "
            f"WHERE {t}_fts MATCH ? AND c.collection = ?"
        )
        params: list[object] = [quoted_or(words), collection]
        for key, value in where.items():
            # Keys are checked (letters, digits, '_.-'), and the path is a parameter anyway.
            sql += " AND json_extract(c.metadata, ?) = ?"
            params += [f'$."{key}"', int(value) if isinstance(value, bool) else value]
        sql += " ORDER BY s, c.source, c.position LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        return [
            Passage(source=s, position=p, text=x, score=-score, metadata=json.loads(m))
            for s, p, x, m, score in rows
        ]

    def count(self, collection: str) -> int:
        with self._lock:
            row = self._db.execute(
                f"SELECT count(*) FROM {self.table} WHERE collection = ?", (collection,)
            ).fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
