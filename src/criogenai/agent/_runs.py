"""Run records: each message of an agent run, stored as it happens, and the run's state.

A run is a list of ``RunEntry`` (one per message, in order; a tool message carries its full
``ToolResult``, artifact included) and one ``RunState``. Where they are kept (Redis on a fleet,
this process's memory embedded) is the store's (``store/_runs``); this is what they say.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from .._config import Settings
from .._errors import RunConflict as RunConflict
from .._errors import RunNotFound as RunNotFound
from .._wire import ToolResult, Versioned
from ..store import RunStore, make_run_store
from ._model import Message

RunStatus = Literal["running", "completed", "failed", "waiting_for_approval", "max_rounds"]


class _Record(Versioned):
    """A run's stored data, versioned like everything else criogenai keeps."""


class RunEntry(_Record):
    """One stored message of a run; ``result`` is the full result behind a tool message."""

    run_id: str
    seq: int
    at: float
    message: Message
    result: ToolResult | None = None


class RunError(_Record):
    """Why a run failed: ``code`` is ``tool_failed``, ``model_error``, or ``error`` (anything else)."""

    code: str
    message: str
    call_id: str | None = None


class RunState(_Record):
    """Where a run stands; written at its start and whenever its status changes."""

    run_id: str
    status: RunStatus
    created: float
    updated: float
    error: RunError | None = None
    user: str | None = Field(None, exclude_if=lambda v: v is None)
    """The scope the run's calls carry (``Agent.run(..., user=)``): whose memories they reach."""


class RunRecords:
    """An agent's runs over the store (``store.RunStore``: Redis on a fleet, memory embedded): the
    records as the agent reads and writes them."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def create(self, state: RunState) -> bool:
        """Store a new run's state; False if the id is taken."""
        return self.store.create(state.run_id, state.model_dump_json())

    def state(self, run_id: str) -> RunState | None:
        raw = self.store.state(run_id)
        return RunState.model_validate_json(raw) if raw else None

    def set_state(self, state: RunState) -> None:
        self.store.set_state(state.run_id, state.model_dump_json())

    def append(self, entry: RunEntry) -> None:
        """Store ``entry`` at position ``entry.seq``; raises RunConflict if that is not the end."""
        if self.store.append(entry.run_id, entry.seq, entry.model_dump_json()):
            return
        if self.store.state(entry.run_id) is None:
            raise RunNotFound(f"no run {entry.run_id!r}")
        raise RunConflict(f"run {entry.run_id}: another process wrote message {entry.seq} first")

    def entries(self, run_id: str) -> list[RunEntry]:
        return [RunEntry.model_validate_json(raw) for raw in self.store.entries(run_id)]


def make_records(settings: Settings) -> RunRecords:
    """The runs of a fleet (Redis) or of this process, as the settings say (``make_run_store``)."""
    return RunRecords(make_run_store(settings))


def now() -> float:
    return time.time()
