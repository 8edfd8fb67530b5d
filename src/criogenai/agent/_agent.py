"""Agent: the loop that asks a model, runs its turns of tool calls, and gives the results back.

Each turn of calls runs through the agent's one ``Dispatcher`` (on the fleet when a broker is
configured, embedded otherwise) under the run's id. Every message is stored as it is made, so a
run that failed or whose process died continues with ``retry()``: a turn already sent is sent
again with the same run id and call ids, and the dispatcher returns the stored results of the
calls that finished instead of running them again.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from .._config import Limits, Retry, Settings
from .._errors import ConfigurationError, ToolError, ToolFailed
from .._loop import run_sync
from .._tracing import genai_span
from .._wire import MAX_CALL_ID_CHARS, OnToolException, ToolCall, ToolResult
from ..dispatcher import Dispatcher
from ..dispatcher._dispatcher import check_run_id, check_scope
from ..memory import Memory
from ..runner._outcomes import invalid_arguments
from ..tools import DEFAULT_QUEUE, MCPServer, Tool, ToolContext, ToolRegistry, tool
from ._anthropic import AnthropicModel
from ._model import (
    AssistantMessage,
    FakeModel,
    Message,
    Model,
    ModelError,
    ModelRequest,
    SystemMessage,
    ToolMessage,
    UserMessage,
    utf8_safe,
)
from ._openai import OpenAIModel
from ._runs import RunEntry, RunError, RunNotFound, RunRecords, RunState, RunStatus, make_records, now

WAITING_STATUSES: frozenset[str] = frozenset({"pending_approval"})
"""Results that mean a call waits for a person: the run stops until it is decided."""


class RunResult(BaseModel):
    """How a run ended: ``completed`` (``output`` is the answer), ``max_rounds``,
    ``waiting_for_approval`` (``pending`` lists the waiting calls) or, from ``get_run``, ``failed``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    status: RunStatus
    output: str = ""
    messages: list[Message] = Field(default_factory=list)
    """What the model was sent and said, in order."""
    tool_results: list[ToolResult] = Field(default_factory=list)
    """Every stored tool result, artifacts included (never sent to a model)."""
    pending: list[ToolResult] = Field(default_factory=list)
    error: RunError | None = None


def resolve_model(model: Model | str) -> Model:
    """``"openai:MODEL"``, ``"anthropic:MODEL"``, ``"fake"`` (a FakeModel that echoes the prompt) or
    a Model instance."""
    if isinstance(model, str):
        if model == "fake":
            return FakeModel()
        provider, _, name = model.partition(":")
        if provider == "openai" and name:
            return OpenAIModel(name)
        if provider == "anthropic" and name:
            return AnthropicModel(name)
        raise ConfigurationError(
            f"unknown model {model!r}: use 'openai:MODEL', 'anthropic:MODEL', 'fake' or a Model object"
        )
    if isinstance(model, Model):
        return model
    raise ConfigurationError(f"{model!r} is not a model: it needs an async complete(request) method")


def _run_error(exc: Exception) -> RunError:
    """What a failed run's record says of the exception that ended it: a tool's failure under
    ``fail``, the model's, or anything else (the store, a hook) by its type and text."""
    if isinstance(exc, ToolFailed):
        return RunError(code=exc.code, message=str(exc), call_id=exc.result.call_id)
    if isinstance(exc, ModelError):
        return RunError(code=exc.code, message=str(exc))
    return RunError(code="error", message=f"{type(exc).__name__}: {exc}"[:2000])


def _dispatch_ids(history: Sequence[RunEntry], index: int) -> list[str]:
    """The ids the calls of the turn at ``index`` run under: the model's own, unless the run used
    that id before (some servers number every turn's calls from 0); the same on every retry."""
    used: set[str] = set()
    ids: list[str] = []
    for entry in history[: index + 1]:
        if not isinstance(entry.message, AssistantMessage):
            continue
        ids = []
        for c in entry.message.tool_calls:
            d, n = c.id, 1
            while d in used:  # within the id's 256 characters: a longest id used twice still runs
                n += 1
                suffix = f"#{n}"
                d = c.id[: MAX_CALL_ID_CHARS - len(suffix)] + suffix
            used.add(d)
            ids.append(d)
    return ids


T = TypeVar("T")


class Agent:
    """A model, its tools and the policy their calls run under; ``run`` drives one task to its end.

    ``approve``, ``before_tool`` and ``after_tool`` are passed to the Dispatcher as given.
    ``limits`` takes ``max_model_rounds`` (default 20) besides the per-call limits. ``memory``
    adds its ``remember``, ``forget`` and ``search_memory`` tools, kept per ``run(..., user=)``.
    """

    def __init__(
        self,
        model: Model | str,
        tools: Iterable[Tool[..., Any] | MCPServer] | ToolRegistry = (),
        *,
        instructions: str | None = None,
        tool_retry: Retry | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_tool_exception: OnToolException = "return_to_model",
        approve: Sequence[str] | None = None,
        before_tool: Sequence[Callable[..., Any]] | None = None,
        after_tool: Sequence[Callable[..., Any]] | None = None,
        settings: Settings | None = None,
        memory: Memory | None = None,
    ) -> None:
        self.model = resolve_model(model)
        self.memory = memory
        if memory is not None:
            tools = ToolRegistry([*tools, *memory.tools])
        self.instructions = instructions
        self.limits = Limits.coerce(limits)
        hooks: dict[str, Any] = {}
        for key, value in (("approve", approve), ("before_tool", before_tool), ("after_tool", after_tool)):
            if value is not None:
                hooks[key] = list(value)
        self.dispatcher = Dispatcher(
            tools,
            tool_retry=tool_retry,
            limits=self.limits,
            on_tool_exception=on_tool_exception,
            settings=settings,
            **hooks,
        )
        self.settings = self.dispatcher.settings
        self.store: RunRecords = make_records(self.settings)
        # The model's GenAI span attributes: its provider (else its class) and model name, if any.
        provider = getattr(self.model, "provider", None) or type(self.model).__name__
        self._genai: dict[str, str] = {"gen_ai.provider.name": str(provider)}
        if isinstance(getattr(self.model, "model", None), str):
            self._genai["gen_ai.request.model"] = self.model.model  # type: ignore[attr-defined]
        self._specs = [t.definition for t in self.dispatcher.registry]

    def __repr__(self) -> str:
        return f"<Agent {self.model!r} tools={self.dispatcher.registry.names()}>"

    def close(self) -> None:
        """Stop the dispatcher's threads (and its embedded worker). Idempotent."""
        self.dispatcher.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs -------------------------------------------------------------------------------------

    async def run(self, prompt: str, *, run_id: str | None = None, user: str | None = None) -> RunResult:
        """Run the task to an answer (or ``max_rounds``, or a call waiting for approval).

        ``user`` is the scope every call of the run carries (kept with the run, so ``retry`` keeps
        it): memory tools see only that user's memories. The model never sees or chooses it.

        Raises ``ToolFailed`` (code ``tool_failed``; ``exc.result.run_id`` is the run) when a tool
        fails under ``on_tool_exception="fail"``, and ``ModelError`` when the model cannot be
        asked; the run is then stored as failed, and ``retry()`` continues it.
        """
        rid = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex
        t = now()
        state = RunState(run_id=rid, status="running", created=t, updated=t, user=check_scope(user))
        if not self.store.create(state):
            raise ConfigurationError(f"run {rid!r} exists: continue it with retry()")
        history: list[RunEntry] = []
        if self.instructions:
            self._append(rid, history, SystemMessage(content=self.instructions))
        self._append(rid, history, UserMessage(content=prompt))
        return await self._drive(state, history)

    def run_sync(self, prompt: str, *, run_id: str | None = None, user: str | None = None) -> RunResult:
        """``run`` for code without an event loop."""
        return run_sync(self.run(prompt, run_id=run_id, user=user), "Agent.run_sync")

    async def retry(self, run_id: str) -> RunResult:
        """Continue a failed, interrupted or approval-waiting run from its stored messages.

        Calls that finished are not run again; a completed run is returned as it is.
        """
        state = self.store.state(run_id)
        if state is None:
            raise RunNotFound(f"no run {run_id!r} is stored (never started, or past its retention)")
        history = self.store.entries(run_id)
        if state.status in ("completed", "max_rounds") or not history:
            return self._result(state, history)
        state = self._set(state, "running")
        return await self._drive(state, history)

    def retry_sync(self, run_id: str) -> RunResult:
        """``retry`` for code without an event loop."""
        return run_sync(self.retry(run_id), "Agent.retry_sync")

    resume = retry
    resume_sync = retry_sync

    def get_run(self, run_id: str) -> RunResult:
        """A stored run as it stands (any status, ``failed`` with its error included)."""
        state = self.store.state(run_id)
        if state is None:
            raise RunNotFound(f"no run {run_id!r} is stored (never started, or past its retention)")
        return self._result(state, self.store.entries(run_id))

    # -- the loop ---------------------------------------------------------------------------------

    async def _drive(self, state: RunState, history: list[RunEntry]) -> RunResult:
        with genai_span("invoke_agent", "", {**self._genai, "criogenai.run_id": state.run_id}) as span:
            try:
                result = await self._loop(state, history)
            except Exception as exc:
                # Whatever ends the run here is stored with it, so that ``get_run`` never shows
                # ``running`` for a run nobody drives any more; ``retry()`` continues it.
                with contextlib.suppress(Exception):  # the store may be what failed
                    self._set(state, "failed", _run_error(exc))
                raise
            span.set_attribute("criogenai.status", result.status)
            return result

    async def _loop(self, state: RunState, history: list[RunEntry]) -> RunResult:
        rid = state.run_id
        while True:
            last = history[-1].message
            if isinstance(last, AssistantMessage) and not last.tool_calls:
                return self._result(self._set(state, "completed"), history)
            turn = self._open_turn(history)
            if turn is not None:
                waiting = await self._run_turn(state, history, turn)
                if waiting:
                    state = self._set(state, "waiting_for_approval")
                    return self._result(state, history, pending=waiting)
                continue
            rounds = sum(isinstance(e.message, AssistantMessage) for e in history)
            if rounds >= self.limits.max_model_rounds:
                return self._result(self._set(state, "max_rounds"), history)
            request = ModelRequest(messages=[e.message for e in history], tools=self._specs)
            model_name = self._genai.get("gen_ai.request.model", "")
            with genai_span("chat", model_name, self._genai, client=True):
                reply = utf8_safe(await self.model.complete(request))
            self._append(rid, history, reply)

    @staticmethod
    def _open_turn(history: list[RunEntry]) -> int | None:
        """The index of the last assistant turn whose calls do not all have results yet."""
        for i in range(len(history) - 1, -1, -1):
            msg = history[i].message
            if isinstance(msg, AssistantMessage):
                answered = len(history) - 1 - i
                return i if msg.tool_calls and answered < len(msg.tool_calls) else None
        return None

    async def _run_turn(self, state: RunState, history: list[RunEntry], index: int) -> list[ToolResult]:
        """Run (or run again) the turn at ``index``; store its results, or return the waiting ones."""
        rid = state.run_id
        turn = history[index].message
        assert isinstance(turn, AssistantMessage)
        ids = _dispatch_ids(history, index)
        refused: dict[str, ToolResult] = {}
        calls: list[ToolCall] = []
        for c, d in zip(turn.tool_calls, ids, strict=True):
            bad = self._unparsed(c, d, rid)
            if bad is not None:
                refused[d] = bad
            else:
                calls.append(ToolCall(id=d, name=c.name, arguments=c.arguments))
        results = await self.dispatcher.run_turn(calls, run_id=rid, scope=state.user) if calls else []
        by_id = refused | {r.call_id: r for r in results}
        ordered = [by_id[d] for d in ids]
        waiting = [r for r in ordered if r.status in WAITING_STATUSES]
        if waiting:
            return waiting
        answered = len(history) - 1 - index
        for c, r in list(zip(turn.tool_calls, ordered, strict=True))[answered:]:
            self._append(rid, history, ToolMessage.of(r, c.id), r)
        return []

    def _unparsed(self, call: ToolCall, dispatch_id: str, run_id: str) -> ToolResult | None:
        """Arguments a model sent as a string that is not a JSON object: invalid, said plainly."""
        if not isinstance(call.arguments, str) or call.name not in self.dispatcher.registry:
            return None
        try:
            json.loads(call.arguments)
            problem = "arguments: expected a JSON object, got a string"
        except ValueError as exc:
            problem = f"arguments: not valid JSON ({exc})"
        out = invalid_arguments(call.name, [problem])
        return ToolResult(
            call_id=dispatch_id,
            name=call.name,
            run_id=run_id,
            status="invalid_arguments",
            content=out.content,
            artifact=out.artifact,
        )

    # -- records ----------------------------------------------------------------------------------

    def _append(
        self, run_id: str, history: list[RunEntry], message: Message, result: ToolResult | None = None
    ) -> None:
        entry = RunEntry(run_id=run_id, seq=len(history), at=now(), message=message, result=result)
        self.store.append(entry)
        history.append(entry)

    def _set(self, state: RunState, status: RunStatus, error: RunError | None = None) -> RunState:
        new = state.model_copy(update={"status": status, "updated": now(), "error": error})
        self.store.set_state(new)
        return new

    @staticmethod
    def _result(
        state: RunState, history: list[RunEntry], *, pending: list[ToolResult] | None = None
    ) -> RunResult:
        last = history[-1].message if history else None
        answered = isinstance(last, AssistantMessage) and state.status == "completed"
        output = (last.content or "") if answered and isinstance(last, AssistantMessage) else ""
        return RunResult(
            run_id=state.run_id,
            status=state.status,
            output=output,
            messages=[e.message for e in history],
            tool_results=[e.result for e in history if e.result is not None],
            pending=pending or [],
            error=state.error,
        )

    # -- an agent as a tool -----------------------------------------------------------------------

    def as_tool(
        self,
        name: str,
        description: str,
        *,
        timeout_secs: float | None = None,
        queue: str = DEFAULT_QUEUE,
    ) -> Tool[..., Any]:
        """This agent as a tool of another: its input is one ``prompt``, its result the answer.

        The inner run's id is ``<outer run>.<call id>``, so a call run again continues the inner
        run instead of starting over. On a fleet the tool runs in a worker, which must import it:
        define it at the top level of a module the worker serves (``--tools that.module``).
        """
        agent = self

        async def run_agent(prompt: str, ctx: ToolContext) -> str:
            rid = f"{ctx.run_id}.{ctx.call_id}"
            if agent.store.state(rid) is None:
                result = await agent.run(prompt, run_id=rid)
            else:
                result = await agent.retry(rid)
            if result.status != "completed":
                raise ToolError(f"the agent {name!r} stopped without an answer ({result.status})")
            return result.output

        return tool(name=name, description=description, timeout_secs=timeout_secs, queue=queue)(run_agent)
