"""Prometheus metrics of a worker: calls by tool and status, durations, retries, queue wait,
abandoned tool threads.

``criogenai worker --metrics-port N`` (extra ``criogenai[metrics]``) serves them over HTTP. Calls
run in pool children under prefork, so the metrics use prometheus-client's multiprocess mode:
each process (the children where calls run, the main process where hard timeouts and lost
processes are seen) writes its samples to files in one directory, and the main process serves
their sum. Counters and histograms of children that exited stay counted.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from typing import Any

from celery import Celery, signals

from ._errors import ConfigurationError
from ._keys import PRIORITY_STEPS, TASK_NAME, queue_lists
from ._message import SENT_AT_HEADER
from ._wire import ToolResult, ToolTask
from .runner import CallObserver, abandoned_threads
from .runner._outcomes import Outcome
from .store import redis_client

OTHER_TOOL = "(other)"
"""The tool label of calls naming a tool this worker does not have: labels stay a bounded set."""
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


def stamp_sent_at(headers: dict[str, Any], eta: str | None = None) -> None:
    """Record in a call's headers when it may start, for the queue-wait histogram."""
    ready = time.time()
    if eta:
        with contextlib.suppress(ValueError):
            ready = max(ready, datetime.datetime.fromisoformat(eta).timestamp())
    headers[SENT_AT_HEADER] = ready


def _stamp(sender: Any = None, headers: Any = None, **_: Any) -> None:
    if sender == TASK_NAME and isinstance(headers, dict):
        stamp_sent_at(headers, headers.get("eta"))


def stamp_published_calls() -> None:
    """Calls published through kombu's producer (``send_task``: re-drives, retries) carry their
    send time. Idempotent."""
    signals.before_task_publish.connect(_stamp, weak=False, dispatch_uid="criogenai-sent-at")


def _multiprocess_dir() -> str:
    """Where the processes' sample files go: PROMETHEUS_MULTIPROC_DIR, or a new directory."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        return path
    path = tempfile.mkdtemp(prefix="criogenai-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    owner = os.getpid()

    def _remove() -> None:
        if os.getpid() == owner:  # not in a pool child that inherited the handler
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(_remove)
    return path


class WorkerMetrics(CallObserver):
    """The metric objects; created once per worker, before the pool forks."""

    def __init__(self, tools: Iterable[str]) -> None:
        from prometheus_client import Counter, Histogram

        self.tools = frozenset(tools)
        self.calls = Counter(
            "criogenai_calls", "Calls that ended on this worker, by tool and status.", ["tool", "status"]
        )
        self.duration = Histogram(
            "criogenai_call_duration_seconds",
            "Time a call's tool code ran (last attempt), by tool.",
            ["tool"],
            buckets=DURATION_BUCKETS,
        )
        self.retries = Counter("criogenai_retries", "Attempts that will be retried, by tool.", ["tool"])
        self.queue_wait = Histogram(
            "criogenai_queue_wait_seconds",
            "Time from publish (or a retry's due time) to the start of a run, by tool.",
            ["tool"],
            buckets=DURATION_BUCKETS,
        )
        self.lost = Counter(
            "criogenai_process_failures",
            "Runs whose process died or was killed at its hard time limit, by tool and reason.",
            ["tool", "reason"],
        )

    def tool(self, name: str) -> str:
        return name if isinstance(name, str) and name in self.tools else OTHER_TOOL

    def run_started(self, payload: ToolTask, attempt: int, queued_secs: float | None) -> None:
        if queued_secs is not None:
            self.queue_wait.labels(self.tool(payload.call.name)).observe(queued_secs)

    def run_ended(self, payload: ToolTask, outcome: Outcome, attempt: int, retry_in: float | None) -> None:
        if retry_in is not None:
            self.retries.labels(self.tool(payload.call.name)).inc()

    def call_ended(self, payload: ToolTask, result: ToolResult) -> None:
        name = self.tool(payload.call.name)
        self.calls.labels(name, result.status).inc()
        self.duration.labels(name).observe(result.duration_secs or 0.0)

    def process_lost(self, payload: ToolTask, reason: str) -> None:
        # In the main process: a call's child died or was killed at its hard limit.
        self.lost.labels(self.tool(payload.call.name), reason).inc()


SCRAPE_TIMEOUT_SECS = 2.0
"""How long a scrape waits for Redis before leaving the queue lengths out."""


class QueueDepth:
    """``criogenai_queue_length{queue}``: messages waiting in each queue this worker consumes, read
    from Redis at each scrape (one pipelined round trip); absent when Redis does not answer."""

    def __init__(self, app: Celery, broker_url: str) -> None:
        self._app = app
        self._client = redis_client(broker_url, timeout_secs=SCRAPE_TIMEOUT_SECS)

    def collect(self) -> Iterable[Any]:
        import redis
        from prometheus_client.core import GaugeMetricFamily

        queues = sorted(self._app.amqp.queues.consume_from or self._app.amqp.queues)
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    for name in queue_lists(queue):
                        pipe.llen(name)
                sizes = pipe.execute()
        except (redis.RedisError, OSError):
            return []
        family = GaugeMetricFamily(
            "criogenai_queue_length", "Calls waiting in each queue this worker consumes.", labels=["queue"]
        )
        steps = len(PRIORITY_STEPS)
        for i, queue in enumerate(queues):
            family.add_metric([queue], sum(sizes[i * steps : (i + 1) * steps]))
        return [family]


class AbandonedThreads:
    """``criogenai_abandoned_tool_threads``: sync tool threads of this (main) process abandoned past
    their time limit and still running, read at each scrape. Prefork children run sync tools on
    their own thread under Celery's limits, so only the threads pool's process has any."""

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        return [GaugeMetricFamily(
            "criogenai_abandoned_tool_threads",
            "Sync tool threads abandoned past their time limit whose tool has not returned "
            "(blocked in C); the worker exits past max_abandoned_threads.",
            value=abandoned_threads(),
        )]


def serve_metrics(
    app: Celery, port: int, tools: Iterable[str], host: str = "127.0.0.1", broker_url: str | None = None
) -> WorkerMetrics:
    """Start the HTTP endpoint and the recording; call before the worker's pool starts. With a
    Redis broker, also the depth of the worker's queues."""
    _multiprocess_dir()  # before prometheus_client is imported: it picks its mode at import
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector
    except ImportError as exc:
        raise ConfigurationError(
            "--metrics-port needs prometheus-client: pip install 'criogenai[metrics]'"
        ) from exc
    from prometheus_client import values

    if values.ValueClass is values.MutexValue:
        # prometheus-client was imported before the directory was set (Celery's CLI imports its
        # plugins, Flower's among them, which imports it): pick its multiprocess mode now, before
        # criogenai's metrics exist, or the pool children's samples would never reach the endpoint.
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(AbandonedThreads())
    if (broker_url or "").startswith(("redis://", "rediss://")):
        registry.register(QueueDepth(app, broker_url or ""))
    metrics = WorkerMetrics(tools)
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on port {port}: {exc}") from exc
    return metrics
