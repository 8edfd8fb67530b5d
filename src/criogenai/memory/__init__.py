"""Memory: ``remember``, ``forget`` and ``search_memory`` tools, kept per user (scope)."""

from ._embeddings import Embedder, EmbeddingError, OpenAIEmbeddings
from ._memory import Memory
from ._store import LocalMemoryStore, MemoryRecord, MemoryStore, RedisMemoryStore

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
