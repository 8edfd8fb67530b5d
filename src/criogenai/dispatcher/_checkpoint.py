"""The checkpoint between a turn's valid calls and the fleet: hooks and approvals before, hooks after.

Before a call is enqueued: a call of an approve-listed tool that already has a record follows the
person's decision (hooks do not run again: the person decided on what they saw); any other call
goes through the ``before_tool`` hooks, and then, if its tool is approve-listed, is put to a
person instead of being sent. On a resumed run, calls that already finished pass untouched: the
engine returns their stored results. After the turn, every result goes through ``after_tool``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._config import Settings
from .._errors import ConfigurationError
from .._wire import ToolCall, ToolResult
from ..runner._outcomes import invalid_arguments
from ..store import ApprovalStore, Ledger, make_approval_store
from ..tools import DEFAULT_MAX_RESULT_CHARS, InvalidArguments, ToolRegistry
from ._approvals import Approvals, PendingApproval, request_approval
from ._hooks import AfterHook, BeforeHook, HookCall, ResultCache, is_async_hook, run_after, run_before
from ._validate import ValidCall, refused

T = TypeVar("T")


@dataclass
class CheckedTurn:
    """What passed the checkpoint: the calls to send, results decided here, and each call as it runs."""

    valid: list[ValidCall]
    done: dict[str, ToolResult]
    ran_as: dict[str, HookCall] = field(default_factory=dict)
    scope: str | None = None


def _waiting(record: PendingApproval) -> ToolResult:
    return refused(
        record.call,
        record.run_id,
        "pending_approval",
        f"Tool {record.tool_name!r} waits for a person to approve this call; it has not run.",
        {
            "approval": {
                "run_id": record.run_id,
                "call_id": record.call_id,
                "arguments": record.call.arguments,
            }
        },
    )


class Checkpoint:
    """Hooks and approvals of one dispatcher."""

    def __init__(
        self,
        registry: ToolRegistry,
        settings: Settings,
        *,
        approve: Iterable[str] = (),
        before_tool: Sequence[BeforeHook] = (),
        after_tool: Sequence[AfterHook] = (),
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> None:
        self.registry = registry
        self.max_result_chars = max_result_chars
        self.approve = frozenset([approve] if isinstance(approve, str) else approve)
        unknown = sorted(self.approve - set(registry.names()))
        if unknown:
            raise ConfigurationError(
                f"approve names tools the dispatcher does not have: {', '.join(unknown)}"
            )
        self.before_hooks = list(before_tool)
        self.after_hooks = list(after_tool)
        for hook in [*self.before_hooks, *self.after_hooks]:
            if not callable(hook):
                raise ConfigurationError(f"a hook must be callable, not {hook!r}")
            owner = getattr(hook, "__self__", None)
            if isinstance(owner, ResultCache):
                owner.bind(settings)
        self.has_async = any(is_async_hook(h) for h in [*self.before_hooks, *self.after_hooks])
        self.settings = settings
        self._store: ApprovalStore | None = None

    @property
    def empty(self) -> bool:
        return not (self.approve or self.before_hooks or self.after_hooks)

    @property
    def store(self) -> ApprovalStore:
        if self._store is None:
            self._store = make_approval_store(self.settings)
        return self._store

    @property
    def approvals(self) -> Approvals:
        """Decide this dispatcher's approvals in process (the only way in the embedded mode)."""
        return Approvals(self.settings, store=self.store)

    async def before(
        self,
        run_id: str,
        valid: list[ValidCall],
        done: dict[str, ToolResult],
        ledger: Ledger | None,
        scope: str | None = None,
    ) -> CheckedTurn:
        """Hooks and approvals for the valid calls; ``ledger`` is given when the run is resumed."""
        turn = CheckedTurn([], dict(done), scope=scope)
        if not (self.approve or self.before_hooks):
            turn.valid = valid
            turn.ran_as = {v.call.id: _seen(v.call, run_id, v, scope) for v in valid}
            return turn
        finished = ledger.finished(run_id, [v.call.id for v in valid]) if ledger is not None else {}
        # A run id the dispatcher made up now has no records yet: only a given run id is looked up.
        asked = [
            v.call.id
            for v in valid
            if ledger is not None and v.tool.name in self.approve and v.call.id not in finished
        ]
        records = {
            c: PendingApproval.model_validate_json(r) for c, r in self.store.get(run_id, asked).items()
        }
        for v in valid:
            outcome: ToolCall | ToolResult = v.call
            if v.call.id not in finished:
                record = records.get(v.call.id)
                if record is None:
                    outcome = await run_before(
                        self.before_hooks, v.call, v.tool, run_id, self.max_result_chars, scope
                    )
                    if isinstance(outcome, ToolCall) and v.tool.name in self.approve:
                        record = request_approval(self.store, run_id, outcome, v.tool.definition)
                if record is not None:
                    outcome = self._decided(record, v)
            if isinstance(outcome, ToolResult):
                turn.done[v.call.id] = outcome
            else:
                turn.valid.append(ValidCall(outcome, v.tool))
                turn.ran_as[v.call.id] = _seen(outcome, run_id, v, scope)
        return turn

    def _decided(self, record: PendingApproval, v: ValidCall) -> ToolCall | ToolResult:
        if record.decision == "pending":
            return _waiting(record)
        if record.decision == "rejected":
            who = {"by": record.by, "decided_at": record.decided_at, "reason": record.reason}
            return refused(
                v.call,
                record.run_id,
                "rejected",
                f"A person rejected this call of tool {record.tool_name!r}: {record.reason}",
                {"approval": who},
            )
        call = v.call.model_copy(update={"arguments": record.effective_arguments})
        checked = v.tool.validate(call.arguments)
        if isinstance(checked, InvalidArguments):
            out = invalid_arguments(call.name, [*checked.problems, "(arguments approved by a person)"])
            return refused(call, record.run_id, "invalid_arguments", out.content, out.artifact)
        return call

    async def after(
        self, turn: CheckedTurn, calls: list[ToolCall], results: dict[str, ToolResult]
    ) -> dict[str, ToolResult]:
        """Every result of the turn through the ``after_tool`` hooks, in call order."""
        if not self.after_hooks:
            return results
        out = dict(results)
        for c in calls:
            seen = turn.ran_as.get(c.id) or HookCall(
                c.name, c.arguments, out[c.id].run_id, c.id, self.registry.get(c.name), turn.scope
            )
            out[c.id] = await run_after(self.after_hooks, seen, out[c.id], self.max_result_chars)
        return out


def _seen(call: ToolCall, run_id: str, v: ValidCall, scope: str | None) -> HookCall:
    arguments: Any = call.arguments
    return HookCall(call.name, arguments, run_id, call.id, v.tool, scope)
