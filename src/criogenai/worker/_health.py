"""Cheap health probes over HTTP, served by the worker's main process (``--health-port``).

``GET /livez``: 200 while the process serves (503 once it is stopping). ``GET /readyz``: 200 when the
worker consumes its queues and Redis answers a PING (1 s per try, tried twice), else 503; both
answer a small JSON object saying which check failed, and how many sync tool threads abandoned
past their time limit still run (``abandoned_threads``; past ``max_abandoned_threads`` the worker
stops, and ``/livez`` says 503). A probe is one HTTP request to a thread of
the running worker: no Python start, no broker round trip, unlike ``celery inspect ping``.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from celery import bootsteps
from celery.worker import state

from .._errors import ConfigurationError
from ..runner import abandoned_threads
from ..store import redis_client

log = logging.getLogger(__name__)

DEFAULT_HEALTH_HOST = "127.0.0.1"
PING_TIMEOUT_SECS = 1.0


class Health:
    """The checks behind the endpoints, for one worker."""

    def __init__(self, worker: Any, redis_url: str | None) -> None:
        self.worker = worker
        self._client = redis_client(redis_url, timeout_secs=PING_TIMEOUT_SECS) if redis_url else None

    def alive(self) -> dict[str, Any]:
        return {"alive": not (state.should_stop or state.should_terminate)}

    @staticmethod
    def abandoned() -> dict[str, Any]:
        """Sync tool threads abandoned past their time limit and still running (threads pool)."""
        return {"abandoned_threads": abandoned_threads()}

    def consuming(self) -> bool:
        """The consumer has started every step (its task consumer among them) on a live connection."""
        consumer = getattr(self.worker, "consumer", None)
        if consumer is None or getattr(consumer, "task_consumer", None) is None:
            return False
        connection = getattr(consumer, "connection", None)
        return bool(
            consumer.blueprint.state == bootsteps.RUN and connection is not None and connection.connected
        )

    def redis_ok(self) -> bool:
        if self._client is None:
            return True
        import redis

        try:
            return bool(self._client.ping())
        except (redis.RedisError, OSError):
            return False

    def ready(self) -> dict[str, Any]:
        checks: dict[str, Any] = {**self.alive(), "consuming": self.consuming(), "redis": self.redis_ok()}
        checks["ready"] = all(checks.values())
        return checks


def _handler(health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/livez":
                body = health.alive()
                ok = body["alive"]
            elif self.path == "/readyz":
                body = health.ready()
                ok = body["ready"]
            else:
                self.send_error(404)
                return
            data = json.dumps({**body, **health.abandoned()}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes come every few seconds: not one log line each."""

    return Handler


def serve_health(worker: Any, redis_url: str | None, port: int, host: str = DEFAULT_HEALTH_HOST) -> None:
    """Serve ``/livez`` and ``/readyz`` on a daemon thread of this process."""
    try:
        server = ThreadingHTTPServer((host, port), _handler(Health(worker, redis_url)))
    except OSError as exc:
        raise ConfigurationError(f"cannot serve health checks on {host}:{port}: {exc}") from exc
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="criogenai-health", daemon=True).start()
