"""RabbitMQ as the broker (the issue's bonus): calls travel through RabbitMQ, while results, claims
and the run's records stay in Redis (``CRIOGENAI_RESULT_BACKEND``), on a real worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from criogenai import Retry, Settings, ToolCall
from tests import fleet_tools
from tests.conftest import fleet_url, key, make_dispatcher, start_worker, wait_until_live

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_turn_runs_with_rabbitmq_as_broker_and_redis_for_results(
    tmp_path: Path, redis_up: None, pool: str
) -> None:
    worker = start_worker(AMQP_URL, tmp_path, pool=pool, wait=False, extra_env={
        "CRIOGENAI_RESULT_BACKEND": fleet_url(),
        "CRIOGENAI_TEST_COUNTER_URL": fleet_url(),
    })
    try:
        wait_until_live(fleet_url(), worker.name, worker)
        settings = Settings(broker_url=AMQP_URL, result_backend=fleet_url(), lease_secs=2.0)
        k = key()
        with make_dispatcher(settings=settings, tool_retry=Retry(max_attempts=3, initial_backoff=0.05)) as d:
            results = d.run_turn_sync([
                ToolCall(id="a", name="echo", arguments={"text": "over amqp"}),
                ToolCall(id="b", name="flaky_read", arguments={"key": k, "fail_times": 1}),
                ToolCall(id="c", name="echo", arguments={"text": 5}),
            ])
        assert [r.status for r in results] == ["ok", "ok", "invalid_arguments"], results
        assert results[0].content == "over amqp"
        assert results[1].attempts == 2
        assert fleet_tools.runs(k) == 2
    finally:
        worker.stop()
