"""Tools for the agent tests' workers, served with ``--tools tests.fleet_tools,tests.agent_tools``.

``research`` is an agent used as a tool: a worker runs it, so it is defined here, at the top level
of a module the worker imports. Its inner agent dispatches its own calls (``echo``) to the fleet
the worker is on (``CRIOGENAI_BROKER_URL`` in the worker's environment).
"""

from __future__ import annotations

from criogenai import Agent, FakeModel, tool
from criogenai.agent import ModelRequest, UserMessage
from tests.fleet_tools import _count, echo


@tool
def fail_once(key: str) -> str:
    """Raise an unexpected exception on the first run under key only."""
    n = _count(key)
    if n == 1:
        raise RuntimeError(f"first run of {key} fails")
    return f"ok on run {n}"


def _look_up(request: ModelRequest) -> list[dict[str, object]]:
    prompt = next(m.content for m in request.messages if isinstance(m, UserMessage))
    return [{"id": "look", "name": "echo", "arguments": {"text": f"found {prompt}"}}]


def _summarise(request: ModelRequest) -> str:
    return "summary: " + "; ".join(request.tool_results.values())


researcher = Agent(FakeModel([_look_up, _summarise]), tools=[echo])
research = researcher.as_tool("research", "Ask the research agent one question.", timeout_secs=30)
