"""What a call's outcome looks like to the model: the text for each status, in one place.

The worker and the dispatcher both build outcomes (the dispatcher for calls it refuses or gives
up on), so the wording the model reads is the same wherever a call ends.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

from .._config import backoff_secs
from .._keys import MAX_LOST_RUNS
from .._message import hard_limit_secs
from .._wire import OnToolException, ToolResult, ToolStatus, ToolTask
from ..tools import ToolRegistry, cut
from ..tools._content import plain

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallReport:
    """What a finished call's task returns to Celery when the ledger keeps Celery's result record
    itself: small, because Celery takes a ``saferepr`` of every return value (for its log line
    and events), which for the whole result cost more CPU than filing it."""

    status: ToolStatus
    attempts: int
    duration_secs: float

    def __repr__(self) -> str:
        return f"<call {self.status}>"


GENERIC_FAILURE = "The tool failed with an internal error. Its details are not available to you."


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of a call gave. ``retryable``: running it again may give something better."""

    status: ToolStatus
    content: str
    artifact: dict[str, Any] | None = None
    truncated: bool = False
    retryable: bool = False
    duration_secs: float = 0.0
    error: BaseException | None = field(default=None, compare=False, repr=False)
    """The exception the tool raised (``exception``): in this process only, never on the wire."""


MAX_NAME_SHOWN = 64
"""The longest tool name a result quotes: no tool's name is longer, so a longer one is forged."""


def shown_name(name: str) -> str:
    """A call's tool name as a result's text quotes it: a forged name of any length cannot flood
    what the model reads."""
    if len(name) <= MAX_NAME_SHOWN:
        return repr(name)
    return f"{name[:MAX_NAME_SHOWN]!r}... (a name of {len(name):,} characters)"


def unknown_tool(name: str, available: list[str], max_chars: int, *, where: str = "") -> Outcome:
    """No tool of that name (``where``: " on this worker"), cut to what the model may be sent."""
    text = f"Unknown tool {shown_name(name)}{where}. Available tools: {', '.join(available) or '(none)'}."
    content = cut(text, max_chars)
    return Outcome("unknown_tool", content.text, {"available": list(available)}, truncated=content.truncated)


def invalid_arguments(name: str, problems: list[str]) -> Outcome:
    """Every problem, made plain text (a validator's message may hold a lone surrogate, which no
    result could be filed with)."""
    problems = [plain(p) for p in problems]
    text = f"Invalid arguments for tool {name!r}:\n" + "\n".join(f"- {p}" for p in problems)
    return Outcome("invalid_arguments", text, {"problems": problems})


def timed_out(name: str, timeout_secs: float, duration: float, *, stopped: bool = False) -> Outcome:
    how = " and was stopped" if stopped else ""
    return Outcome(
        "timeout",
        f"Tool {name!r} did not finish within {timeout_secs:g} s{how}.",
        retryable=True,
        duration_secs=duration,
    )


def stopped_by_cancel(name: str, duration: float) -> Outcome:
    """A running call stopped because its turn was cancelled."""
    return Outcome(
        "cancelled",
        f"Tool {name!r} was stopped: its turn was cancelled. It may have done part of its work.",
        duration_secs=duration,
    )


def cancelled_before_start(name: str) -> Outcome:
    """A call that never ran because its turn was cancelled first."""
    return Outcome("cancelled", f"Tool {name!r} was not run: its turn was cancelled.")


def not_admitted(name: str, why: str, waited_secs: float) -> Outcome:
    """A call admission never published: its turn was cancelled (``cancelled``), its dispatcher
    closed (``closed``), or its wait behind the turn's cap (``turn``) or a fleet limit ran out."""
    if why == "cancelled":
        return cancelled_before_start(name)
    if why == "closed":
        return Outcome("not_started", f"Tool {name!r} was not started: its dispatcher was closed first.")
    behind = (
        "the turn's earlier calls (max_calls_in_flight_per_turn)"
        if why == "turn"
        else "a fleet-wide concurrency or rate limit"
    )
    return Outcome(
        "not_started",
        f"Tool {name!r} was not started: it waited behind {behind} for {waited_secs:g} s. "
        "It will not run later.",
    )


def unexpected(name: str, exc: BaseException, policy: OnToolException, duration: float) -> Outcome:
    """An exception the tool did not mean for the model: shown or hidden as the policy says."""
    details = {  # plain: an exception's text may hold a lone surrogate, which could not be filed
        "type": plain(type(exc).__name__),
        "message": plain(str(exc)),
        "traceback": plain("".join(traceback.format_exception(exc))),
    }
    shown = f"{details['type']}: {details['message']}"
    content = shown if policy == "return_to_model" else GENERIC_FAILURE
    log.info("tool %s raised %s", name, details["type"])
    return Outcome("exception", content, {"exception": details}, duration_secs=duration)


# -- the result a worker or the embedded engine files for a call ----------------------------------


def not_started(name: str, why: str) -> Outcome:
    """A call no worker took: given up by its dispatcher, and made unclaimable."""
    return Outcome("not_started", f"Tool {name!r} was not started: {why}. It will not run later.")


def gave_no_result(name: str) -> Outcome:
    """A call past its whole budget without a result: given up, and made unclaimable."""
    return Outcome("lost", f"Tool {name!r} gave no result in time; the call may or may not have run.")


def unconfirmed_cancel(name: str, grace_secs: float) -> Outcome:
    """A running call told to stop whose worker did not file ``cancelled`` within the grace."""
    return Outcome("cancelled", f"Tool {name!r} was told to stop (its turn was cancelled) and did not "
                   f"confirm within {grace_secs:g} s; it may still be running.")


def kept_dying(name: str) -> Outcome:
    """A call whose runs died more often than its bound allows: given up, made unclaimable."""
    return Outcome("lost", f"Tool {name!r} could not finish: the workers running it kept dying.")


def not_run_again(name: str, why: str) -> Outcome:
    """A call whose run died, sent again, that no worker took (``why``): it may have run in part."""
    return Outcome("lost", f"Tool {name!r} may or may not have run: its worker died, and {why} to "
                   "run it again.")


def store_lost_in_flight(name: str) -> Outcome:
    """A call that may not be sent twice, in flight when Redis restarted without its data."""
    return Outcome("lost", f"Tool {name!r} may or may not have run: the store lost its data while the "
                   "call was in flight, and the tool is not read-only or idempotent, so it was not "
                   "sent again.")


def closed_in_flight(name: str) -> Outcome:
    """A call in flight when its dispatcher closed: it may finish unobserved, filed under its run."""
    return Outcome(
        "lost",
        f"Tool {name!r} gave no result: its dispatcher was closed while the call was in flight. "
        "It may or may not have run, and may still.",
    )


def ended(payload: ToolTask, outcome: Outcome) -> ToolResult:
    """The result a dispatcher gives for a call it ends itself (nothing of it ran there)."""
    call = payload.call
    return ToolResult(
        call_id=call.id, name=call.name, run_id=payload.run_id, status=outcome.status, content=outcome.content
    )


def budget_secs(payload: ToolTask, queue_wait_secs: float, slack_secs: float = 10.0) -> float:
    """The longest a call may take from submit to result: its wait for a worker, every attempt
    with its backoff, and ``slack_secs`` (an engine's own bookkeeping)."""
    per_attempt = hard_limit_secs(payload.timeout_secs) + payload.max_backoff_secs
    return queue_wait_secs + payload.max_attempts * per_attempt + slack_secs


def call_result(payload: ToolTask, outcome: Outcome, attempts: int) -> ToolResult:
    return ToolResult(
        call_id=payload.call.id,
        name=payload.call.name,
        run_id=payload.run_id,
        status=outcome.status,
        content=outcome.content,
        artifact=outcome.artifact,
        attempts=attempts,
        truncated=outcome.truncated,
        duration_secs=round(outcome.duration_secs, 6),
    )


def unknown_tool_result(payload: ToolTask, registry: ToolRegistry) -> ToolResult:
    """The result for a call of a tool this worker does not have (a forged name): nothing ran."""
    names, limit = registry.names(), payload.max_result_chars
    outcome = unknown_tool(payload.call.name, names, limit, where=" on this worker")
    return call_result(payload, outcome, 0)


def refused_result(payload: ToolTask, why: str) -> ToolResult:
    """The result for a call whose message was refused before anything ran (``_signing``)."""
    call = payload.call
    return ToolResult(
        call_id=call.id,
        name=call.name,
        run_id=payload.run_id,
        status="not_started",
        content=f"Tool {shown_name(call.name)} was not run: the worker refused the call's message ({why}).",
        artifact={"refused": why},
    )


def too_many_runs(payload: ToolTask, attempt: int) -> Outcome | None:
    """The outcome of a call whose runs kept dying under it, once run ``attempt`` is one too many."""
    if attempt <= payload.max_attempts + MAX_LOST_RUNS:
        return None
    return Outcome(
        "lost",
        f"Tool {payload.call.name!r} could not finish: its process died {attempt - 1} "
        "times while running this call.",
    )


def retry_delay(payload: ToolTask, outcome: Outcome, attempt: int) -> float | None:
    """The wait before running the call again after run ``attempt``, or None when it is final."""
    if not (outcome.retryable and attempt < payload.max_attempts):
        return None
    return backoff_secs(
        attempt, initial=payload.initial_backoff_secs, maximum=payload.max_backoff_secs, jitter=payload.jitter
    )


def filed_result(payload: ToolTask, outcome: Outcome, attempts: int) -> tuple[ToolResult, bool]:
    """The result to file, and whether it finishes the call: an exception under ``fail`` does not
    (it fails the turn, which may be run again)."""
    fails_run = outcome.status == "exception" and payload.on_tool_exception == "fail"
    return call_result(payload, outcome, attempts), not fails_run
