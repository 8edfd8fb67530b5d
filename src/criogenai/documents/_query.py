"""A search query as data: the words of the text, never syntax for the store's query language.

Both stores are given only the query's words (runs of letters and digits), each quoted, joined by
OR, so quotes, operators, SQL, NUL bytes and control characters are never interpreted: they are
separators. A query is therefore a bag of words, ranked by relevance on either store.
"""

from __future__ import annotations

import re

from .._errors import InvalidQuery as InvalidQuery

MAX_TERMS = 32
"""Distinct words of a query that are searched for; the rest of a very long query is ignored."""
MAX_TERM_CHARS = 64
"""Longer "words" (hashes, base64) are dropped: no store can stem or rank them usefully."""
QUERY_PATTERN = r"[^\W_]"
"""What a query must contain to mean anything (a letter or digit): the tool schema's pattern."""

_WORD = re.compile(r"[^\W_]+")


def terms(query: str) -> list[str]:
    """The distinct lower-cased words of ``query``, in order, at most ``MAX_TERMS``.

    Raises InvalidQuery when there are none (an empty query, or only punctuation).
    """
    if not isinstance(query, str):
        raise InvalidQuery(f"the query must be text, not {type(query).__name__}")
    seen: dict[str, None] = {}
    for match in _WORD.finditer(query):
        word = match.group().lower()
        if len(word) <= MAX_TERM_CHARS:
            seen.setdefault(word, None)
            if len(seen) == MAX_TERMS:
                break
    if not seen:
        raise InvalidQuery(
            f"the query has no words to search for (runs of letters or digits, at most {MAX_TERM_CHARS} long)"
        )
    return list(seen)


def quoted_or(words: list[str]) -> str:
    """``"a" OR "b"``: every word a quoted string (FTS5 and websearch_to_tsquery alike)."""
    return " OR ".join(f'"{w}"' for w in words)


_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
FilterValue = str | int | float | bool


def check_filter(where: dict[str, FilterValue] | None) -> dict[str, FilterValue]:
    """A metadata filter: keys of letters, digits and ``_.-``; values str, int, float or bool."""
    if not where:
        return {}
    if not isinstance(where, dict):
        raise InvalidQuery("filter must be a dict of metadata key → value")
    for k, v in where.items():
        if not isinstance(k, str) or not _KEY.match(k):
            raise InvalidQuery(f"filter key {k!r}: use 1-64 letters, digits, '_', '.' or '-'")
        if not isinstance(v, str | int | float | bool):
            raise InvalidQuery(f"filter value for {k!r} must be str, int, float or bool")
    return where
