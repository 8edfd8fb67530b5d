"""The data that crosses processes: versioned, frozen pydantic models.

The dispatcher and the worker share nothing else but these models, the key names in ``_keys`` and
the tool definitions. Every model carries ``v`` (from ``Versioned``, the one base of everything
criogenai writes for another process or a later read: calls, results, messages, run records,
catalog records, approvals) so that a fleet in the middle of a rolling upgrade can refuse what it
does not understand instead of misreading it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from ._keys import DEFAULT_QUEUE

WIRE_VERSION: Literal[1] = 1
MAX_CALL_ID_CHARS = 256
"""The longest call id a model may send (``ToolCall.id``)."""
DEFAULT_MAX_STORED_CHARS = 1_000_000
DEFAULT_MAX_RESULT_CHARS = 100_000
"""What the model is shown of a result at most, by default (``Limits.max_result_chars``)."""

ToolStatus = Literal[
    "ok",
    "invalid_arguments",
    "unknown_tool",
    "tool_error",
    "timeout",
    "exception",
    "lost",
    "not_started",
    "pending_approval",
    "rejected",
    "blocked",
    "cancelled",
]
"""What happened to a call.

- ``ok``: the tool returned; ``content`` is its result as JSON text (a string result as is).
- ``invalid_arguments`` / ``unknown_tool``: refused before any code ran.
- ``tool_error``: the tool raised ``ToolError``; ``content`` is its message.
- ``timeout``: the call ran past its time limit (on every attempt it was allowed).
- ``exception``: an unexpected exception, shown or hidden as ``on_tool_exception`` says.
- ``lost``: the call started but its worker died too often, or its result never came back.
- ``not_started``: no worker picked the call up in time; it will not run later.
- ``pending_approval``: the tool is in the ``approve`` list and waits for a person; it has not run.
  Running the turn again with the same run id runs it once approved.
- ``rejected``: a person rejected the call; ``content`` carries their reason. The tool never ran.
- ``blocked``: a ``before_tool`` hook blocked the call (``content`` is its message, or names the
  hook that raised) and the tool never ran; or an ``after_tool`` hook raised, and the result was
  withheld from the model (kept in ``artifact["withheld"]``; ``attempts`` says the tool ran).
- ``cancelled``: the turn was cancelled (``Dispatcher.cancel``); ``attempts`` 0 means the tool never
  ran, otherwise it was told to stop while running and may have done part of its work.
"""

FAILED_STATUSES: frozenset[str] = frozenset(
    {"tool_error", "exception", "timeout", "lost", "invalid_arguments", "unknown_tool"}
)
"""Statuses whose task ends in Celery's FAILURE state (``CallFailed``): the call did not do its job."""

OnToolException = Literal["return_to_model", "return_generic", "fail"]


class Versioned(BaseModel):
    """Data that crosses processes or outlives one: frozen, unknown fields refused, no NaN or
    infinite number (a deadline of NaN compares false with every time: it would never pass), and
    a ``v``.

    A model changes its format by overriding ``v`` (``v: Literal[2] = 2``); a reader that meets a
    version it does not know refuses the record instead of guessing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    v: Literal[1] = WIRE_VERSION


class ToolDefinition(Versioned):
    """A tool as the model and the engine see it, without its code: one description used everywhere.

    ``Tool.definition`` is this; a worker publishes it to the catalog (``CatalogEntry`` adds who
    serves it), an agent offers it to its model, and an approval records its schema and hash.
    """

    name: str
    description: str
    """What the model reads about the tool (a function's cleaned docstring by default)."""
    parameters: dict[str, Any]
    """The JSON Schema of the arguments, exactly as the model sees it."""
    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False
    timeout_secs: float | None = None
    """The tool's own time limit per call; None: the dispatcher's ``Limits.tool_timeout_secs``."""
    queue: str = DEFAULT_QUEUE
    """The Celery queue its calls are sent to."""
    schema_hash: str = ""
    """A short hash of name, description and parameters, to tell two versions of a tool apart.
    Always derived from them (a value given is replaced); kept in the data for readers of the catalog."""

    @model_validator(mode="after")
    def _derive_hash(self) -> ToolDefinition:
        described = {"name": self.name, "description": self.description, "parameters": self.parameters}
        text = json.dumps(described, sort_keys=True, separators=(",", ":"))
        object.__setattr__(self, "schema_hash", hashlib.sha256(text.encode()).hexdigest()[:16])
        return self

    @property
    def retryable(self) -> bool:
        """Read-only and idempotent tools may be run again; other tools never are."""
        return self.read_only or self.idempotent

    @property
    def flags(self) -> list[str]:
        """The flags that are set, by name."""
        return [f for f in ("read_only", "idempotent", "destructive") if getattr(self, f)]

    @property
    def version(self) -> str:
        """The schema hash, plus whatever else of the definition calls depend on when it differs."""
        extra = f" queue={self.queue}" + (f" flags={','.join(self.flags)}" if self.flags else "")
        if self.timeout_secs is not None:
            extra += f" timeout={self.timeout_secs:g}s"
        return self.schema_hash + extra


class ToolCall(Versioned):
    """One call the model asked for: its id, the tool's name and the arguments as the model sent them."""

    id: str = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    """Printable text: it goes into log lines and what an operator's terminal shows, where a newline
    or an escape sequence chosen by the model would forge lines or rewrite the screen."""
    name: str
    arguments: Any = Field(default_factory=dict)
    """Usually a dict; anything else is reported as ``invalid_arguments``, never raised."""

    @field_validator("id")
    @classmethod
    def _printable_id(cls, value: str) -> str:
        if not value.isprintable():
            bad = next(ch for ch in value if not ch.isprintable())
            raise ValueError(f"a call id must be printable text; this one holds U+{ord(bad):04X} "
                             "(a control, format or line-separator character)")
        return value


class ToolResult(Versioned):
    """The outcome of one call. ``content`` is exactly what the model is sent."""

    call_id: str
    name: str
    run_id: str = ""
    status: ToolStatus
    content: str
    """The text the model reads; never holds what ``return_generic`` hides."""
    artifact: dict[str, JsonValue] | None = None
    """Kept with the run (problems, exception details, the full value), never sent to a model."""
    attempts: int = 0
    """How many times the tool's code started running for this call (0: it never ran)."""
    truncated: bool = False
    """``content`` was cut to the size limit."""
    duration_secs: float | None = None
    cached: bool = False
    """A ``before_tool`` hook (such as ``ResultCache``) answered the call; the tool did not run."""
    signature: str | None = Field(None, exclude_if=lambda v: v is None)
    """HMAC of the result by the worker that filed it (``criogenai._signing``), when it has a signing
    secret; a dispatcher with the secret accepts no result without a valid one. Left out when None,
    so results stay as they were without a secret (a reader older than this field refuses a signed
    result: with signing on, upgrade dispatchers before workers)."""

    @property
    def ok(self) -> bool:
        """True when the tool returned a value."""
        return self.status == "ok"


class ToolTask(Versioned):
    """The body of a Celery task: one validated call and the policy its worker applies to it."""

    run_id: str
    call: ToolCall
    timeout_secs: float = Field(gt=0)
    max_attempts: int = Field(ge=1)
    """Runs allowed for this call; 1 unless the tool is read-only or idempotent."""
    initial_backoff_secs: float = Field(ge=0)
    max_backoff_secs: float = Field(ge=0)
    jitter: float = Field(ge=0, le=1)
    on_tool_exception: OnToolException
    max_result_chars: int = Field(gt=0)
    reply_to: str | None = None
    """The Redis list the dispatcher waits on; None when nobody waits (a re-drive after a crash)."""
    deadline: float
    """Unix time after which the call must not start: the dispatcher has given up on it."""
    max_stored_chars: int = Field(
        DEFAULT_MAX_STORED_CHARS, gt=0, exclude_if=lambda v: v == DEFAULT_MAX_STORED_CHARS
    )
    """What the worker keeps with the run at most (a cut result's full value, exception details)."""
    scope: str | None = Field(None, exclude_if=lambda v: v is None)
    """Whose data the call may touch (a user, tenant or namespace the application named for the run,
    never the model): memory tools read and write only under it. Signed with the call; left out of
    the message when None, so workers that predate it still read calls without one."""
    signature: str | None = Field(None, exclude_if=lambda v: v is None)
    """HMAC of the call by its dispatcher (``criogenai._signing``), when a signing secret is set.
    Left out of the message when None, so workers that predate it still read unsigned calls."""


Decision = Literal["pending", "approved", "rejected"]


class PendingApproval(Versioned):
    """One call that waits (or waited) for a person, and what they decided."""

    run_id: str
    call: ToolCall
    """The call as it was put to the person (after any ``before_tool`` hook changed it)."""
    parameters: dict[str, Any]
    """The tool's JSON Schema (its ``ToolDefinition.parameters``), so that any process can check
    edited arguments without the tool."""
    schema_hash: str = ""
    """The definition's ``schema_hash`` when the call was put to a person."""
    requested_at: float
    decision: Decision = "pending"
    arguments: dict[str, Any] | None = None
    """Edited arguments of an approval; None when approved as asked (or not approved)."""
    by: str = ""
    reason: str = ""
    decided_at: float | None = None

    @property
    def call_id(self) -> str:
        return self.call.id

    @property
    def tool_name(self) -> str:
        return self.call.name

    @property
    def effective_arguments(self) -> Any:
        """The arguments the call runs with once approved."""
        return self.call.arguments if self.arguments is None else self.arguments
