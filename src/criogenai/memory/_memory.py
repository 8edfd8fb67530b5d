"""Memory: the ``remember``, ``forget`` and ``search_memory`` tools, kept per scope.

The scope (a user, tenant or namespace) is the application's, given per run (``Agent.run(...,
user=)``, ``Dispatcher.run_turn(..., scope=)``); it travels with each call like the run id, signed
when signing is on, and reaches the tool as ``ToolContext.scope``. No tool has a parameter that
names a scope, and every store operation takes the call's own, so a call can never read, list or
forget another scope's memories, whatever its arguments say.
"""

# No `from __future__ import annotations`: the tools' hints use local values (limits), which
# the schema builder must see at definition.
import datetime as dt
import hashlib
import re
import time
from typing import Annotated, Any

from pydantic import Field

from .._config import Settings
from .._errors import ConfigurationError, ToolError
from ..store import MemoryRecord, MemoryStore, make_memory_store
from ..tools import Tool, ToolContext, tool
from ._embeddings import Embedder, EmbeddingError
from ._rank import rank

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
"""No ':': it separates the namespace from the scope in a memory key, and a scope may hold one."""
DEFAULT_MAX_CHARS = 2000
DEFAULT_MAX_MEMORIES = 1000


def default_store(settings: Settings | None = None) -> MemoryStore:
    """The fleet's Redis when a broker is configured (workers and agent alike), else this process."""
    return make_memory_store(settings or Settings.from_env())


class Memory:
    """What ``Agent(memory=...)`` gives the model: three tools over ``store``, under ``namespace``.

    ``max_chars`` caps one memory's text (longer ones are ``invalid_arguments``), ``max_memories``
    the memories of one scope (past it, ``remember`` is a ``tool_error`` saying to forget some).
    With an ``embedder`` (``OpenAIEmbeddings``), memories are also ranked by meaning. On a fleet,
    the workers serve the same tools: ``remember, forget, search_memory = memory.tools`` at the top
    level of a module they load with ``--tools``.
    """

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        namespace: str = "default",
        embedder: Embedder | None = None,
        max_chars: int = DEFAULT_MAX_CHARS,
        max_memories: int = DEFAULT_MAX_MEMORIES,
    ) -> None:
        if not _NAMESPACE.match(namespace):
            raise ConfigurationError(f"memory namespace {namespace!r}: 1-100 letters, digits or '_.-'")
        if max_chars < 1 or max_memories < 1:
            raise ConfigurationError("max_chars and max_memories must be positive")
        self.store = store if store is not None else default_store()
        self.namespace = namespace
        self.embedder = embedder
        self.max_chars = max_chars
        self.max_memories = max_memories
        self.tools: tuple[Tool[..., Any], Tool[..., Any], Tool[..., Any]] = self._tools()

    def __repr__(self) -> str:
        return f"<Memory {self.namespace!r} in {self.store!r}>"

    def _scope(self, ctx: ToolContext) -> str:
        if not ctx.scope:
            raise ToolError("memory is not available in this conversation (the application named no user)")
        return ctx.scope

    def _vector(self, text: str) -> list[float] | None:
        if self.embedder is None:
            return None
        try:
            return self.embedder.embed([text])[0]
        except EmbeddingError as exc:
            raise ToolError(f"memory search by meaning is unavailable: {exc}", retryable=True) from None

    def _tools(self) -> tuple[Tool[..., Any], Tool[..., Any], Tool[..., Any]]:
        memory = self
        max_chars = self.max_chars

        @tool(idempotent=True)
        def remember(
            text: Annotated[
                str,
                Field(
                    min_length=1,
                    max_length=max_chars,
                    description="One self-contained fact to keep, written to make sense later on its own.",
                ),
            ],
            ctx: ToolContext,
        ) -> dict[str, str]:
            """Keep a fact about the user or their work for later conversations (a preference, a
            decision, a detail they gave). Returns the memory's id, which `forget` takes."""
            scope = memory._scope(ctx)
            # The id comes from the call, so a retried call stores the same memory, not a second one.
            digest = hashlib.sha256(f"{len(ctx.run_id)}:{ctx.run_id}:{ctx.call_id}".encode()).hexdigest()
            record = MemoryRecord(
                id=f"m-{digest[:16]}", text=text, created=time.time(), vector=memory._vector(text)
            )
            if not memory.store.add(memory.namespace, scope, record, memory.max_memories):
                raise ToolError(
                    f"memory is full ({memory.max_memories} memories): "
                    "forget some that no longer matter first"
                )
            return {"id": record.id, "created": _when(record.created)}

        @tool(idempotent=True)
        def forget(
            id: Annotated[
                str,
                Field(min_length=1, max_length=100, description="The id `remember` or `search_memory` gave."),
            ],
            ctx: ToolContext,
        ) -> str:
            """Forget one memory by its id, when it is wrong, outdated or the user asks."""
            scope = memory._scope(ctx)
            if memory.store.delete(memory.namespace, scope, id):
                return f"Forgot {id}."
            return f"There is no memory {id} (already forgotten, or never made)."

        @tool(read_only=True)
        def search_memory(
            query: Annotated[
                str,
                Field(min_length=1, max_length=1000, description="Words about what to recall."),
            ],
            ctx: ToolContext,
            limit: Annotated[int, Field(ge=1, le=50, description="At most this many memories.")] = 5,
        ) -> list[dict[str, Any]]:
            """Recall what was remembered about the user, most relevant first: each memory's id,
            text and when it was made (UTC)."""
            scope = memory._scope(ctx)
            records = memory.store.all(memory.namespace, scope)
            vector = memory._vector(query) if records else None
            return [
                {"id": r.id, "text": r.text, "created": _when(r.created), "score": round(score, 4)}
                for r, score in rank(query, records, limit, vector)
            ]

        return remember, forget, search_memory


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")
