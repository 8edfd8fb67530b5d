"""Autoscaling on queue length: KEDA's list names are kombu's, and workers export the queue depth."""

from __future__ import annotations

import concurrent.futures
import socket
import urllib.request

import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from criogenai import ToolCall
from criogenai._keys import queue_lists
from tests.conftest import ROOT, fleet_url, make_dispatcher, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _depth(port: int, queue: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "criogenai_queue_length" and sample.labels == {"queue": queue}:
                return float(sample.value)
    return None


def _keda_trigger() -> dict[str, str]:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "keda" / "scaledobject.yaml").read_text()))
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    return dict(trigger["metadata"])


def test_keda_watches_the_list_where_calls_wait_and_the_metric_shows_its_depth(worker_factory) -> None:  # type: ignore[no-untyped-def]
    # Given one worker with one slot, exporting metrics, and KEDA's example trigger
    trigger = _keda_trigger()
    client = redis.Redis.from_url(fleet_url())
    client.delete(*queue_lists("criogenai"))
    port = _free_port()
    worker_factory(pool="threads", concurrency=1, queues="criogenai",
                   extra_env={"CRIOGENAI_METRICS_PORT": str(port)})
    assert _depth(port, "criogenai") == 0
    # When a turn of five slow calls waits for that slot
    calls = [ToolCall(id=f"s{i}", name="sleep_for", arguments={"seconds": 0.8}) for i in range(5)]
    with make_dispatcher() as d, concurrent.futures.ThreadPoolExecutor(1) as pool:
        turn = pool.submit(d.run_turn_sync, calls)
        # Then the calls wait in the list KEDA's trigger names, and the metric shows them
        seen: list[tuple[int, float | None]] = []

        def waiting() -> bool:
            seen.append((int(client.llen(trigger["listName"])), _depth(port, "criogenai")))
            return seen[-1][0] >= 2 and (seen[-1][1] or 0) >= 2

        wait_for(waiting, what=f"calls waiting in {trigger['listName']!r}: {seen[-3:]}")
        assert [r.status for r in turn.result(timeout=60)] == ["ok"] * 5
    # And once they ran, the depth is back to zero
    wait_for(lambda: _depth(port, "criogenai") == 0, what="an empty queue")
