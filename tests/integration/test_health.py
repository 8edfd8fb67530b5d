"""Cheap health checks: /livez and /readyz served by a real worker, and the container files using them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import yaml

from tests.conftest import ROOT, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_readyz_follows_redis_and_livez_stays_up(worker_factory, own_redis) -> None:  # type: ignore[no-untyped-def]
    # Given a worker serving health checks (a Celery worker option given to `criogenai worker`)
    port = _free_port()
    worker_factory(own_redis.url, pool="threads", concurrency=2, extra_args=("--health-port", str(port)))
    # Then it is alive, and ready once it consumes its queues with Redis answering
    wait_for(lambda: _probe(port, "/readyz")[0] == 200, what="the worker to be ready")
    assert _probe(port, "/readyz") == (200, {"alive": True, "consuming": True, "redis": True, "ready": True,
                                             "abandoned_threads": 0})
    assert _probe(port, "/livez") == (200, {"alive": True, "abandoned_threads": 0})
    # When Redis goes away, it is not ready, but still alive (a restart would not help)
    own_redis.stop()
    wait_for(lambda: _probe(port, "/readyz")[0] == 503, what="not ready without Redis")
    status, body = _probe(port, "/readyz")
    assert status == 503 and body["redis"] is False and body["ready"] is False
    assert _probe(port, "/livez")[0] == 200
    # And when Redis is back, it is ready again
    own_redis.start()
    wait_for(lambda: _probe(port, "/readyz")[0] == 200, timeout=40, what="ready again")


def test_the_compose_file_is_valid_checks_worker_health_and_keeps_flower_private() -> None:
    # The Compose spec's own JSON schema, as check-jsonschema ships it (vendor.compose-spec)
    checked = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         "docker-compose.yml"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    worker = services["worker"]
    probe = " ".join(worker["healthcheck"]["test"])
    assert f"127.0.0.1:{worker['environment']['CRIOGENAI_HEALTH_PORT']}/readyz" in probe
    assert services["agent"]["depends_on"]["worker"]["condition"] == "service_healthy"
    # Flower: its login from the environment, with no default, and published on loopback only
    flower = services["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
    assert all(str(p).startswith("127.0.0.1:") for p in flower["ports"])
    # Metrics: the workers bind them on the container's address on purpose (the default is loopback)
    assert worker["environment"]["CRIOGENAI_METRICS_HOST"] == "0.0.0.0" and "ports" not in worker
    # The image's own HEALTHCHECK asks the same endpoint
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "HEALTHCHECK" in dockerfile and "/readyz" in dockerfile
    assert "ENV CRIOGENAI_HEALTH_PORT=" in dockerfile
