"""Human approval: calls of approve-listed tools wait, stored under their run, until a person decides.

A ``PendingApproval`` record is written when the dispatcher first meets such a call and is decided
once, by any process (``Approvals`` or ``criogenai approvals ...``), with a compare-and-set so two
people can never both win. The dispatcher reads the decision when the turn is run again with the
same run id; nothing else carries it, so a process that dies between deciding and resuming loses
nothing. The records are kept by the store (``store/_approvals``): in Redis for the retention time
with a Redis URL, in this process's memory without one (the embedded engine).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._config import Settings
from .._errors import ApprovalConflict as ApprovalConflict
from .._errors import ApprovalNotFound as ApprovalNotFound
from .._errors import CriogenaiError
from .._errors import InvalidApprovalArguments as InvalidApprovalArguments
from .._wire import PendingApproval as PendingApproval
from .._wire import ToolCall, ToolDefinition
from ..store import ApprovalStore, make_approval_store
from ..tools._tool import argument_problems


def request_approval(
    store: ApprovalStore, run_id: str, call: ToolCall, definition: ToolDefinition
) -> PendingApproval:
    """Put a call to a person, unless it already was; returns the record that stands."""
    now = time.time()
    record = PendingApproval(
        run_id=run_id,
        call=call,
        parameters=definition.parameters,
        schema_hash=definition.schema_hash,
        requested_at=now,
    )
    return PendingApproval.model_validate_json(store.add(run_id, call.id, record.model_dump_json(), now))


def check_edit(record: PendingApproval, arguments: Any) -> list[str]:
    """The problems of edited arguments against the schema the call was put with (empty if fine)."""
    return argument_problems(record.parameters, arguments)


MAX_SWAP_TRIES = 5
"""A swap fails only when another decision landed first, so the second try always settles."""


class Approvals:
    """List and decide pending approvals, from any process that reaches the same Redis.

    A call is decided once. Repeating the decision it already has (approve with the same
    arguments, or reject with the same reason) is accepted and changes nothing, so a retried
    request is harmless; any other second decision raises ``ApprovalConflict``. When Redis does
    not answer, every method raises ``StoreUnavailable``.
    """

    def __init__(self, settings: Settings | None = None, *, store: ApprovalStore | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.store: ApprovalStore = store or make_approval_store(self.settings)

    def get(self, run_id: str, call_id: str) -> PendingApproval:
        """The record of one call, whatever its decision; ``ApprovalNotFound`` if there is none."""
        raw = self.store.get(run_id, [call_id]).get(call_id)
        if raw is None:
            raise ApprovalNotFound(f"no approval is stored for call {call_id!r} of run {run_id!r}")
        return PendingApproval.model_validate_json(raw)

    def records(self, run_id: str | None = None, *, decided: bool = False) -> list[PendingApproval]:
        """Records of one run (or of every run), oldest first; undecided only unless ``decided``."""
        out: list[PendingApproval] = []
        for rid in [run_id] if run_id is not None else self.store.runs():
            out.extend(PendingApproval.model_validate_json(raw) for raw in self.store.all(rid).values())
        return sorted(
            (r for r in out if decided or r.decision == "pending"), key=lambda r: (r.requested_at, r.call_id)
        )

    def pending(self, run_id: str | None = None) -> list[PendingApproval]:
        """The calls that still wait for a person, of one run or of every run."""
        return self.records(run_id)

    def approve(
        self, run_id: str, call_id: str, arguments: dict[str, Any] | None = None, by: str = ""
    ) -> PendingApproval:
        """Let the call run, as asked or with ``arguments`` (checked against the tool's schema first:
        ``InvalidApprovalArguments`` lists the problems and nothing is recorded)."""

        def decide(current: PendingApproval) -> PendingApproval:
            edited = arguments
            if edited is not None:
                problems = check_edit(current, edited)
                if problems:
                    raise InvalidApprovalArguments(
                        f"the edited arguments do not fit tool {current.tool_name!r}: " + "; ".join(problems),
                        problems,
                    )
                if edited == current.call.arguments:
                    edited = None
            return current.model_copy(
                update={"decision": "approved", "arguments": edited, "by": by, "decided_at": time.time()}
            )

        return self._decide(run_id, call_id, decide)

    def reject(self, run_id: str, call_id: str, reason: str, by: str = "") -> PendingApproval:
        """Refuse the call; the model gets a ``rejected`` result carrying ``reason``."""
        if not reason.strip():
            raise ValueError("a rejection needs a reason: the model is told it")

        def decide(current: PendingApproval) -> PendingApproval:
            return current.model_copy(
                update={"decision": "rejected", "reason": reason, "by": by, "decided_at": time.time()}
            )

        return self._decide(run_id, call_id, decide)

    def _decide(
        self, run_id: str, call_id: str, decide: Callable[[PendingApproval], PendingApproval]
    ) -> PendingApproval:
        for _ in range(MAX_SWAP_TRIES):
            raw = self.store.get(run_id, [call_id]).get(call_id)
            if raw is None:
                raise ApprovalNotFound(f"no approval is stored for call {call_id!r} of run {run_id!r}")
            current = PendingApproval.model_validate_json(raw)
            if current.decision != "pending":
                wanted = decide(current.model_copy(update={"decision": "pending"}))
                if (wanted.decision, wanted.arguments, wanted.reason) == (
                    current.decision,
                    current.arguments,
                    current.reason,
                ):
                    return current
                who = f" by {current.by}" if current.by else ""
                raise ApprovalConflict(
                    f"call {call_id!r} of run {run_id!r} was already {current.decision}{who}; "
                    f"the first decision stands",
                    current,
                )
            new = decide(current)
            if self.store.swap(run_id, call_id, raw, new.model_dump_json()):
                return new
        raise CriogenaiError(f"call {call_id!r} of run {run_id!r} kept changing while being decided")
