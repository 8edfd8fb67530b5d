"""PostgresStore: a collection's chunks in PostgreSQL, searched with its full-text search.

Each chunk keeps a generated ``tsvector`` column under a GIN index; a query's words go through
``websearch_to_tsquery`` as one bound parameter (each word quoted, joined by ``or``) and rank with
``ts_rank`` normalised by length. Connections come from a psycopg_pool pool, opened on first use
in each process (so a prefork worker's children each open their own), with a statement timeout so
that no search waits for ever. pgvector is detected (``has_vector``) but not used yet.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from .._errors import ConfigurationError
from ._model import Chunk, Passage
from ._query import FilterValue, quoted_or
from ._sqlite import check_table

_LANGUAGE = re.compile(r"^[a-z_]{1,40}$")


class PostgresStore:
    """Chunks in table ``table`` of the database at ``conninfo`` (a libpq URL or key=value string).

    ``language`` is the text-search configuration (stemming and stop words) of index and queries.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "criogenai_chunks",
        language: str = "english",
        max_connections: int = 4,
        timeout_secs: float = 10.0,
    ) -> None:
        if not _LANGUAGE.match(language):
            raise ConfigurationError(
                f"language {language!r}: a text-search configuration name, like 'english'"
            )
        self.conninfo = conninfo
        self.table = check_table(table)
        self.language = language
        self.max_connections = max_connections
        self.timeout_secs = timeout_secs
        self._pool: ConnectionPool | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self.has_vector: bool | None = None
        """Whether the server offers pgvector; known after first use."""

    def __repr__(self) -> str:
        return f"<PostgresStore table={self.table!r} language={self.language!r}>"

    def _connections(self) -> ConnectionPool:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                # A pool inherited through fork shares its sockets with the parent: never use it.
                ms = int(self.timeout_secs * 1000)
                pool = ConnectionPool(
                    self.conninfo,
                    min_size=1,
                    max_size=self.max_connections,
                    timeout=self.timeout_secs,
                    kwargs={"options": f"-c statement_timeout={ms}", "connect_timeout": 5},
                    open=False,
                    name=f"criogenai-{self.table}",
                )
                pool.open(wait=True, timeout=self.timeout_secs)
                self._pool, self._pid = pool, os.getpid()
                self._setup(pool)
            return self._pool

    def _setup(self, pool: ConnectionPool) -> None:
        t = sql.Identifier(self.table)
        with pool.connection() as conn, conn.transaction():
            # Workers starting together would race on CREATE ... IF NOT EXISTS.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"criogenai:{self.table}",))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} ("
                    " id bigserial PRIMARY KEY, collection text NOT NULL, source text NOT NULL,"
                    " position integer NOT NULL, text text NOT NULL, metadata jsonb NOT NULL,"
                    " tsv tsvector GENERATED ALWAYS AS (to_tsvector({lang}::regconfig, text)) STORED)"
                ).format(t=t, lang=sql.Literal(self.language))
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} USING gin (tsv)").format(
                    i=sql.Identifier(f"{self.table}_tsv"), t=t
                )
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (collection, source)").format(
                    i=sql.Identifier(f"{self.table}_source"), t=t
                )
            )
            row = conn.execute(
                "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"
            ).fetchone()
            self.has_vector = bool(row and row[0])

    def replace(self, collection: str, sources: Sequence[str], chunks: Sequence[Chunk]) -> None:
        t = sql.Identifier(self.table)
        with self._connections().connection() as conn, conn.transaction():
            conn.execute(
                sql.SQL("DELETE FROM {t} WHERE collection = %s AND source = ANY(%s)").format(t=t),
                (collection, list(sources)),
            )
            with conn.cursor().copy(
                sql.SQL("COPY {t} (collection, source, position, text, metadata) FROM STDIN").format(t=t)
            ) as copy:
                for c in chunks:
                    copy.write_row((collection, c.source, c.position, c.text, Jsonb(c.metadata)))

    def remove(self, collection: str, source: str) -> int:
        with self._connections().connection() as conn:
            cur = conn.execute(
                sql.SQL("DELETE FROM {t} WHERE collection = %s AND source = %s").format(
                    t=sql.Identifier(self.table)
                ),
                (collection, source),
            )
            return cur.rowcount

    def search(
        self, collection: str, words: list[str], limit: int, where: dict[str, FilterValue]
    ) -> list[Passage]:
        query = sql.SQL(
            "SELECT source, position, text, metadata, ts_rank(tsv, q, 1) AS score"
            " FROM {t}, websearch_to_tsquery({lang}::regconfig, %s) AS q"
            " WHERE collection = %s AND tsv @@ q AND metadata @> %s"
            " ORDER BY score DESC, source, position LIMIT %s"
        ).format(t=sql.Identifier(self.table), lang=sql.Literal(self.language))
        params: tuple[Any, ...] = (quoted_or(words), collection, Jsonb(where), limit)
        with self._connections().connection() as conn:
            rows = conn.execute(query, params).fetchall()
        return [
            Passage(source=s, position=p, text=x, score=float(score), metadata=m)
            for s, p, x, m, score in rows
        ]

    def count(self, collection: str) -> int:
        with self._connections().connection() as conn:
            query = sql.SQL("SELECT count(*) FROM {t} WHERE collection = %s")
            row = conn.execute(query.format(t=sql.Identifier(self.table)), (collection,)).fetchone()
        return int(row[0]) if row else 0

    def drop(self) -> None:
        """Drop the table and its indexes (every collection in it)."""
        with self._connections().connection() as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=sql.Identifier(self.table)))

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.close()
            self._pool = None
