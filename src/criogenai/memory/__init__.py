"""Memory: ``remember``, ``forget`` and ``search_memory`` tools, kept per user (scope)."""

from ..store import LocalMemoryStore, MemoryRecord, MemoryStore, RedisMemoryStore
from ._embeddings import Embedder, EmbeddingError, OpenAIEmbeddings
from ._memory import Memory

__all__ = [
    "Embedder",
    "EmbeddingError",
    "LocalMemoryStore",
    "Memory",
    "MemoryRecord",
    "MemoryStore",
    "OpenAIEmbeddings",
    "RedisMemoryStore",
]
