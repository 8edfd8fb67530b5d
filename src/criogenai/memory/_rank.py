"""Ranking memories: BM25 over their words (bm25s), fused with similarity of meaning when there are
vectors (reciprocal rank fusion, so neither score's scale dominates)."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from ..store import MemoryRecord

_WORD = re.compile(r"[^\W_]+")
_FUSION_K = 60


@functools.cache
def _bm25s() -> Any:
    # Imported on first search: it brings numpy, which nothing else in a worker needs.
    import bm25s

    return bm25s


@functools.cache
def _stopwords() -> frozenset[str]:
    return frozenset(_bm25s().stopwords.STOPWORDS_EN)


def words(text: str) -> list[str]:
    stop = _stopwords()
    found = [w for w in _WORD.findall(text.lower()) if w not in stop]
    return found or [""]  # bm25s needs a token per document


def rank(
    query: str, records: list[MemoryRecord], limit: int, query_vector: list[float] | None = None
) -> list[tuple[MemoryRecord, float]]:
    """The best ``limit`` memories for ``query`` with their scores, best first; only memories that
    share a word with it, or (with vectors) any memory ranked by meaning."""
    if not records:
        return []
    retriever = _bm25s().BM25()
    retriever.index([words(r.text) for r in records], show_progress=False)
    scores = retriever.get_scores([w for w in words(query) if w])
    keyword = sorted((i for i in range(len(records)) if scores[i] > 0), key=lambda i: -scores[i])
    if query_vector is None:
        return [(records[i], float(scores[i])) for i in keyword[:limit]]
    with_vectors = [i for i in range(len(records)) if records[i].vector]
    meaning = sorted(with_vectors, key=lambda i: -_cosine(query_vector, records[i].vector or []))
    fused: dict[int, float] = {}
    for ranking in (keyword, meaning):
        for place, i in enumerate(ranking):
            fused[i] = fused.get(i, 0.0) + 1.0 / (_FUSION_K + place + 1)
    best = sorted(fused, key=lambda i: -fused[i])[:limit]
    return [(records[i], fused[i]) for i in best]


def _cosine(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return -1.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else -1.0
