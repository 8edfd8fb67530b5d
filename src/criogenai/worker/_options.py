"""criogenai's worker settings as options of Celery's own ``worker`` command, applied in one place.

``create_app`` adds them to ``celery worker`` (``app.user_options``) and connects ``apply`` to
``celeryd_init``, which Celery sends while it builds the worker, before logging is set up and the
pool starts. So ``criogenai worker ...`` (which hands its arguments to Celery) and
``celery -A criogenai.worker worker ...`` take Celery's whole worker CLI (``--autoscale``,
``--max-tasks-per-child``, ``-O fair``, ...) and every criogenai setting; each option defaults to
its ``CRIOGENAI_*`` variable.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click
from celery import Celery, signals

from .._errors import ConfigurationError
from ..runner import CallObserver
from ..tools import ToolRegistry

DEFAULT_METRICS_HOST = "127.0.0.1"
"""Metrics are served on loopback unless told otherwise (``--metrics-host 0.0.0.0`` in a container)."""


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def env_port(name: str) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigurationError(f"{name} must be a TCP port number, not {raw!r}")
    return int(raw)


def worker_options() -> list[click.Option]:
    """criogenai's options of ``celery worker``; the defaults are read when the command runs."""
    return [
        click.Option(
            ["--log-format"],
            type=click.Choice(["text", "json"]),
            default=lambda: os.environ.get("CRIOGENAI_LOG_FORMAT") or "text",
            help="criogenai: json for one JSON object per line ($CRIOGENAI_LOG_FORMAT).",
        ),
        click.Option(
            ["--metrics-port"],
            type=int,
            default=lambda: env_port("CRIOGENAI_METRICS_PORT"),
            help="criogenai: serve Prometheus metrics on this port ($CRIOGENAI_METRICS_PORT).",
        ),
        click.Option(
            ["--metrics-host"],
            default=lambda: os.environ.get("CRIOGENAI_METRICS_HOST") or DEFAULT_METRICS_HOST,
            help="criogenai: address the metrics bind to ($CRIOGENAI_METRICS_HOST, default 127.0.0.1).",
        ),
        click.Option(
            ["--health-port"],
            type=int,
            default=lambda: env_port("CRIOGENAI_HEALTH_PORT"),
            help="criogenai: serve /livez and /readyz on this port ($CRIOGENAI_HEALTH_PORT).",
        ),
        click.Option(
            ["--health-host"],
            default=lambda: os.environ.get("CRIOGENAI_HEALTH_HOST") or "127.0.0.1",
            help="criogenai: address the health checks bind to ($CRIOGENAI_HEALTH_HOST, default 127.0.0.1).",
        ),
        click.Option(
            ["--otel/--no-otel"],
            default=lambda: env_flag("CRIOGENAI_OTEL"),
            help="criogenai: trace each call with OpenTelemetry ($CRIOGENAI_OTEL=1).",
        ),
    ]


def default_queues(registry: ToolRegistry) -> list[str]:
    """The queues a worker serves when ``-Q`` does not say: ``$CRIOGENAI_QUEUES``, else its tools'."""
    named = [q.strip() for q in os.environ.get("CRIOGENAI_QUEUES", "").split(",") if q.strip()]
    return named or sorted({t.queue for t in registry})


def _pool_name(options: dict[str, Any], app: Celery) -> str:
    """``prefork`` when calls run in forked children, else ``threads`` (the tracing set-up differs)."""
    from celery import concurrency
    from celery.concurrency.prefork import TaskPool as Prefork

    pool = options.get("pool_cls") or app.conf.worker_pool
    cls = pool if isinstance(pool, type) else concurrency.get_implementation(pool)
    return "prefork" if issubclass(cls, Prefork) else "threads"


def apply(
    app: Celery, registry: ToolRegistry, worker: Any, options: dict[str, Any], redis_url: str | None = None
) -> None:
    """Apply criogenai's settings to a worker Celery is building (queues, logs, metrics, health
    checks, traces)."""
    if not options.get("queues"):
        app.amqp.queues.select(default_queues(registry))
    level = options.get("loglevel") or "INFO"
    level_name = logging.getLevelName(level) if isinstance(level, int) else str(level).upper()
    if options.get("log_format") == "json":
        from .._logging import install_json_logging

        _observe(app, install_json_logging(app, level_name))
        worker.quiet = True  # no banner: every line on the output is JSON
    port = options.get("metrics_port") or 0
    if port:
        from .._metrics import serve_metrics

        host = options.get("metrics_host") or DEFAULT_METRICS_HOST
        _observe(app, serve_metrics(app, int(port), registry.names(), host, broker_url=app.conf.broker_url))
    if options.get("health_port"):
        from ._health import serve_health

        host = options.get("health_host") or "127.0.0.1"
        serve_health(worker, redis_url, int(options["health_port"]), host)
    if options.get("otel"):
        from .._tracing import instrument_worker

        instrument_worker(_pool_name(options, app))


def _observe(app: Celery, observer: CallObserver) -> None:
    """Have the app's call runner tell ``observer`` of every call (logs, metrics)."""
    runtime = getattr(app, "criogenai_runtime", None)
    if runtime is not None:
        runtime.runner.observers.add(observer)


def install(app: Celery, registry: ToolRegistry, redis_url: str | None = None) -> None:
    """Give ``app``'s ``worker`` command criogenai's options, applied as its worker is built."""
    for option in worker_options():
        app.user_options["worker"].add(option)

    @signals.celeryd_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def _init(sender: Any = None, instance: Any = None, options: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is not app:
            return
        try:
            apply(app, registry, instance, dict(options or {}), redis_url)
        except ConfigurationError as exc:  # Celery logs and ignores what its signals' handlers raise
            print(f"criogenai: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
