"""Admission: calls held back by a turn's cap or a fleet-wide gate always end up launched or
refused, even when the store behind the gates fails for a moment."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from criogenai import ToolCall
from criogenai._wire import ToolTask
from criogenai.dispatcher._admission import Admission, Send
from criogenai.store._limits import Gate, MemoryLimiter


def send(call_id: str, gates: tuple[Gate, ...] = ()) -> Send:
    task = ToolTask(run_id="r", call=ToolCall(id=call_id, name="t", arguments={}), timeout_secs=5,
                    max_attempts=1, initial_backoff_secs=0, max_backoff_secs=0, jitter=0,
                    on_tool_exception="return_to_model", max_result_chars=100, deadline=time.time() + 60)
    return Send(task, "criogenai", False, gates)


class FailsOnce(MemoryLimiter):
    """A limiter whose store is away for its first answer."""

    def __init__(self) -> None:
        super().__init__(lease_secs=10)
        self.failed = False

    def admit(self, gates: Sequence[Gate], members: list[str]) -> int:
        if not self.failed:
            self.failed = True
            raise ConnectionError("store away")
        return super().admit(gates, members)


def test_a_failing_gate_store_delays_gated_calls_and_loses_none() -> None:
    launched: list[str] = []
    refused: list[str] = []
    done = threading.Event()

    def launch(run_id: str, turn: object, sends: list[Send]) -> None:
        launched.extend(s.payload.call.id for s in sends)
        if len(launched) == 3:
            done.set()

    admission: Admission[object] = Admission(
        FailsOnce(), launch, lambda r, t, s, why: refused.append(s.payload.call.id), cap=64
    )
    try:
        gate = (Gate("tool:t", 5),)
        admission.add("r", object(), [send("free"), send("g1", gate), send("g2", gate)])
        assert done.wait(5), launched
    finally:
        admission.close()
    assert sorted(launched) == ["free", "g1", "g2"]
    assert refused == []


def test_closing_admission_hands_back_every_call_it_never_launched() -> None:
    admission: Admission[object] = Admission(
        MemoryLimiter(lease_secs=10), lambda r, t, s: None, lambda r, t, s, why: None, cap=1
    )
    gate = (Gate("tool:t", 1),)
    turn = object()
    admission.add("r", turn, [send("a", gate), send("b", gate), send("c", gate)])
    time.sleep(0.3)  # "a" takes the only place; "b" and "c" wait behind the turn's cap of 1
    unsent = admission.close()
    assert sorted(s.payload.call.id for _, _, s in unsent) == ["b", "c"]
    assert all(t is turn for _, t, _ in unsent)
