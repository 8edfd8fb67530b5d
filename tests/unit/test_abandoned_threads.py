"""Sync tools abandoned past their time limit are counted while their thread is still held, and
what a process does as they pile up: a worker stops past its cap, the embedded engine warns."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery.worker import state

from criogenai import Dispatcher, ToolCall, tool
from criogenai.runner import abandoned_threads, on_abandoned
from criogenai.runner._executor import WARN_ABANDONED_AT, _WarnOnDoubling
from criogenai.worker._pool import EXIT_TOO_MANY_ABANDONED, StopPastCap, abandoned_cap
from tests.conftest import wait_for

_release = threading.Event()


@tool(timeout_secs=1)  # room for a new thread to take it on a loaded machine
def waits_in_c() -> str:
    """Block on a lock (in C, where the exception raised into its thread cannot reach it)."""
    _release.wait()
    return "released"


@tool(timeout_secs=1)
def loops_in_python() -> str:
    """Run Python code past the limit: the exception raised into its thread ends it at once."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pass
    return "ran out"


@tool(timeout_secs=5)
def quick() -> str:
    """Return within the limit."""
    return "done"


@pytest.fixture
def told() -> Iterator[list[int]]:
    """The counts the process's policy is told, in order; the default policy again after."""
    counts: list[int] = []
    on_abandoned(counts.append)
    _release.clear()
    yield counts
    _release.set()
    on_abandoned(None)


def test_sync_tools_blocked_in_c_past_their_limit_are_counted_until_they_return(told: list[int]) -> None:
    wait_for(lambda: abandoned_threads() == 0, what="threads of earlier tests to return")
    calls = [ToolCall(id=f"c{i}", name="waits_in_c", arguments={}) for i in range(3)]
    calls += [ToolCall(id="py", name="loops_in_python", arguments={}),
              ToolCall(id="q", name="quick", arguments={})]
    with Dispatcher([waits_in_c, loops_in_python, quick]) as d:
        # When three tools stay blocked in C past their limit, one loops in Python, one returns
        results = d.run_turn_sync(calls)
        assert [r.status for r in results] == ["timeout"] * 4 + ["ok"]
        # Then the three blocked threads count, as the dispatcher shows, and the policy was told
        # of each; the Python one, ended by the exception raised into it, soon does not
        wait_for(lambda: abandoned_threads() == 3, what="the Python loop's thread to end")
        assert d.abandoned_tool_threads == 3
        assert len(told) == 4 and 3 <= max(told) <= 4  # the Python one may have ended before
        # And once their tools return, their threads no longer count
        _release.set()
        wait_for(lambda: d.abandoned_tool_threads == 0, what="the released threads to be uncounted")


def test_the_default_policy_warns_at_16_and_at_each_doubling(caplog: pytest.LogCaptureFixture) -> None:
    warn = _WarnOnDoubling()
    with caplog.at_level(logging.WARNING, logger="criogenai.runner._executor"):
        for count in [*range(1, 40), 39, 20, 70]:
            warn(count)
    said = [r.getMessage().split()[0] for r in caplog.records]
    assert WARN_ABANDONED_AT == 16 and said == ["16", "32", "70"]


def test_a_worker_stops_once_at_its_cap_with_its_own_status(caplog: pytest.LogCaptureFixture) -> None:
    stop = StopPastCap(3)
    try:
        with caplog.at_level(logging.CRITICAL, logger="criogenai.worker._pool"):
            stop(1)
            stop(2)
            assert not state.should_stop
            for count in (3, 4, 5):
                stop(count)
        assert state.should_stop == EXIT_TOO_MANY_ABANDONED == 4
        assert [r.levelname for r in caplog.records] == ["CRITICAL"]
        assert "3 sync tool threads abandoned" in caplog.records[0].getMessage()
    finally:
        state.should_stop = None


def test_the_cap_defaults_to_16_or_the_concurrency_whichever_is_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRIOGENAI_MAX_ABANDONED_THREADS", raising=False)
    app = SimpleNamespace()
    assert (abandoned_cap(app, 4), abandoned_cap(app, 100)) == (16, 200)  # a whole window and more
    monkeypatch.setenv("CRIOGENAI_MAX_ABANDONED_THREADS", "7")
    assert abandoned_cap(app, 100) == 7
    app.criogenai_max_abandoned_threads = 5  # the worker option, as Celery built the worker
    assert abandoned_cap(app, 100) == 5
