"""Exceptions, in three families; every error a caller can catch is defined here.

ToolError                      raised by a tool's author; its message goes to the model
CriogenaiError                 raised by criogenai to programmers
├── ToolDefinitionError        also a TypeError: a tool cannot be defined as written
├── ConfigurationError         also a ValueError: a setting is wrong
├── ToolFailed                 a call failed under on_tool_exception="fail"; __cause__: the tool's error
├── CallFailed                 a call's Celery task failed (tool_error, exception, timeout, ...)
├── ApprovalConflict           a call was already decided otherwise; the first decision stands
├── ApprovalNotFound           also a LookupError: no approval is stored for that run and call
├── InvalidApprovalArguments   also a ValueError: edited arguments do not fit the tool's schema
├── ModelError                 an agent's model could not be asked
├── RunNotFound                also a LookupError: no agent run is stored under that id
├── RunConflict                another process wrote to the same agent run at the same time
├── MCPServerError             an MCP server could not start, broke mid-call, or did not speak MCP
├── InvalidQuery               also a ValueError: a collection query has nothing to search for
├── EmbeddingError             the embeddings server failed or answered nonsense
└── StoreError                 Redis failed a command of the store (approvals, catalog, results, ...)
    └── StoreUnavailable       Redis did not answer, or refused this client

RemoteToolException            stands in for an exception raised in a worker process

Each is also importable from the package that raises it (``criogenai.dispatcher``, ``.agent``,
``.tools``, ``.documents``, ``.memory``) and from ``criogenai``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._wire import PendingApproval, ToolResult


class ToolError(Exception):
    """A failure the model can act on; its message is sent to the model as the tool's result.

    ``retryable=True`` says calling again may work: read-only and idempotent tools are then
    retried by the engine before the model sees the error.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class CriogenaiError(Exception):
    """Base of the errors criogenai raises to programmers."""


class ToolDefinitionError(CriogenaiError, TypeError):
    """A tool cannot be defined as written (an unsupported hint, a bad name, a bad schema)."""


class ConfigurationError(CriogenaiError, ValueError):
    """A setting is missing or inconsistent."""


class RemoteToolException(Exception):
    """An exception raised by a tool in a worker, carried back as its type, message and traceback."""

    def __init__(self, type_name: str, message: str, traceback_text: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}\n\nRemote traceback:\n{self.traceback_text}"


class ToolFailed(CriogenaiError):
    """A tool raised an unexpected exception under ``on_tool_exception="fail"``: the run fails.

    ``code`` is ``"tool_failed"``; ``result`` is the failed call's result (its artifact holds the
    exception), and ``results`` every result of the turn, so finished calls are not lost.
    ``__cause__`` is the tool's own exception object on the embedded engine; on a fleet it was
    raised in a worker process, so a ``RemoteToolException`` describes it instead.
    """

    code = "tool_failed"

    def __init__(self, message: str, *, result: ToolResult, results: list[ToolResult]) -> None:
        super().__init__(message)
        self.result = result
        self.results = results


class CallFailed(CriogenaiError):
    """What a worker's Celery task raises when its call ended with a failure status, after filing
    the call's result: Celery's state (FAILURE), its events and Flower then show the call as failed.
    ``AsyncResult(task_id).get()`` raises it. It carries the status, tool name and ids, never the
    tool's error text (which ``return_generic`` hides); the result itself is filed under the run.
    """

    def __init__(self, status: str, tool: str, run_id: str, call_id: str) -> None:
        super().__init__(status, tool, run_id, call_id)  # Celery rebuilds it from these
        self.status, self.tool, self.run_id, self.call_id = status, tool, run_id, call_id

    def __str__(self) -> str:
        return f"call {self.call_id} of run {self.run_id}: tool {self.tool!r} ended {self.status}"


class StoreError(CriogenaiError):
    """Redis failed a command of criogenai's store; ``__cause__`` is redis-py's own error."""


class StoreUnavailable(StoreError):
    """Redis did not answer (down, unreachable, too slow) or refused this client (its credentials,
    its certificate): trying again later may work, unless it was a refusal."""


class ApprovalConflict(CriogenaiError):
    """The call was already decided differently; the first decision stands (see ``approval``)."""

    def __init__(self, message: str, approval: PendingApproval) -> None:
        super().__init__(message)
        self.approval = approval


class ApprovalNotFound(CriogenaiError, LookupError):
    """No approval is stored for that run and call (never asked, or past its retention)."""


class InvalidApprovalArguments(CriogenaiError, ValueError):
    """Edited arguments do not match the tool's schema; nothing was recorded."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class ModelError(CriogenaiError):
    """The model could not be asked (HTTP errors after retries, a bad reply, an exhausted script)."""

    code = "model_error"


class RunNotFound(CriogenaiError, LookupError):
    """No run is stored under that id (never started here, or past its retention)."""


class RunConflict(CriogenaiError):
    """Another process wrote to the run at the same time; this one stopped."""


class MCPServerError(CriogenaiError):
    """An MCP server could not be started, broke mid-call, or answered something that is not MCP.

    A call that meets it ends ``exception`` with this text; the next call starts a new session.
    """


class InvalidQuery(CriogenaiError, ValueError):
    """The query has nothing to search for (no letter or digit), or a filter is malformed."""


class EmbeddingError(CriogenaiError):
    """The embeddings server could not be reached, refused the request or answered nonsense."""


CallFailed.__module__ = "criogenai"  # where Celery finds it when rebuilding it from a result record
