"""An agent with the Tools page's clinic tools and a scripted model: ``python examples/clinic_agent.py``.

With no broker configured it runs embedded, in this process. With ``CRIOGENAI_BROKER_URL`` set,
the calls run on the fleet: start a worker first with ``criogenai worker --tools examples.clinic``.
Swap ``FakeModel(SCRIPT)`` for ``"openai:gpt-5-mini"`` (and set ``OPENAI_API_KEY``, or
``OPENAI_BASE_URL`` for a local server) to let a real model choose the calls.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from criogenai import Agent, FakeModel, Retry
from criogenai.agent import ModelRequest
from examples.clinic import get_lab_result, schedule_visit, send


def answer(request: ModelRequest) -> str:
    """The last round: the model reads what the tools said and answers."""
    booked = request.tool_results.get("visit", "")
    return f"LAB-12345 is final. Home visit booked ({booked}); the care team has been told."


SCRIPT = [
    # Round 1: two lookups at once, one with an id the tool refuses.
    [
        {"id": "lab_1", "name": "get_lab_result", "arguments": {"test_id": "LAB-12345"}},
        {"id": "lab_2", "name": "get_lab_result", "arguments": {"test_id": "12345"}},
    ],
    # Round 2: book the visit (a wrong kind first: the engine refuses it) and tell the team.
    [
        {"id": "visit_bad", "name": "schedule_visit",
         "arguments": {"patient_ref": "P-1", "kind": "spa", "slots": ["2026-12-03T09:00"]}},
        {"id": "visit", "name": "schedule_visit",
         "arguments": {"patient_ref": "P-1", "kind": "home", "slots": ["2026-12-03T09:00"]}},
        {"id": "note", "name": "send_message", "arguments": {"text": "LAB-12345 final; visit booked."}},
    ],
    answer,
]


def main() -> int:
    with Agent(
        FakeModel(SCRIPT),
        tools=[schedule_visit, get_lab_result, send],
        tool_retry=Retry(max_attempts=4, initial_backoff=1.0),
        limits={"tool_timeout_secs": 20},
        on_tool_exception="return_generic",
    ) as agent:
        where = "embedded" if agent.settings.embedded else agent.settings.broker_url
        result = agent.run_sync("Check lab LAB-12345, book a home visit for P-1 and tell the team.")
    print(f"Run {result.run_id} ({where}): {result.status}\n")
    for r in result.tool_results:
        print(f"{r.call_id} {r.name} -> {r.status}: {r.content}")
    print(f"\nAnswer: {result.output}")
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
