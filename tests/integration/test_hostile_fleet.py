"""Hostile data on real workers (each pool): a result no UTF-8 record can carry, and a validator a
model's arguments break, end the call at once with a clear status, run once, and log no secret."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from criogenai import Dispatcher, Settings, ToolCall
from criogenai._wire import ToolResult
from criogenai.tools._tool import remote_tool
from tests import hostile_tools
from tests.conftest import WorkerProcess, fleet_url, start_worker
from tests.fleet_tools import runs


@pytest.fixture(scope="module", params=["prefork", "threads"])
def worker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           redis_up: None) -> Iterator[WorkerProcess]:
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("hostile"), pool=request.param, concurrency=2,
                     tools="tests.hostile_tools", queues=hostile_tools.QUEUE)
    yield w
    w.stop()


def run_one(name: str, arguments: dict[str, object]) -> ToolResult:
    """One call through a dispatcher that knows the tool only by its definition (as ``mcp serve``
    and catalog readers do): the tool's own validators then run only on the worker."""
    settings = Settings(broker_url=fleet_url(), lease_secs=2.0)
    tools = [remote_tool(t.definition) for t in (hostile_tools.takes_item, hostile_tools.decoded_badly)]
    with Dispatcher(tools, settings=settings, on_tool_exception="return_generic",
                    limits={"tool_timeout_secs": 20}) as d:
        (result,) = d.run_turn_sync([ToolCall(id="c1", name=name, arguments=arguments)])
    return result


@pytest.mark.parametrize(("how", "status"), [("value", "exception"), ("tool_error", "tool_error"),
                                             ("exception", "exception")])
def test_a_text_holding_a_lone_surrogate_ends_the_call_once_and_at_once(
    worker: WorkerProcess, how: str, status: str
) -> None:
    key = uuid.uuid4().hex
    result = run_one("decoded_badly", {"key": key, "how": how})

    assert result.status == status, result
    assert result.duration_secs is not None and result.duration_secs < 5
    assert runs(key) == 1 and result.attempts == 1
    assert "SECRET" not in result.content and "SECRET" not in worker.output()


def test_a_validator_a_models_arguments_break_is_invalid_arguments_on_the_worker(
    worker: WorkerProcess,
) -> None:
    key = uuid.uuid4().hex
    result = run_one("takes_item", {"item": {"name": "boom"}, "key": key})

    assert result.status == "invalid_arguments", result
    assert "raised RuntimeError" in result.content and "SECRET" not in result.content
    assert runs(key) == 0
    assert "SECRET" not in worker.output()
