"""criogenai's worker settings as options of Celery's own ``worker`` command, applied in one place.

``create_app`` adds them to ``celery worker`` (``app.user_options``) and connects ``apply`` to
``celeryd_init``, which Celery sends while it builds the worker, before logging is set up and the
pool starts. So ``criogenai worker ...`` (which hands its arguments to Celery) and
``celery -A criogenai.worker worker ...`` take Celery's whole worker CLI (``--autoscale``,
``--max-tasks-per-child``, ``-O fair``, ...) and every criogenai setting. The options are made
from ``WorkerSettings`` (``WORKER_OPTIONS``: name, type, help, default from its ``CRIOGENAI_*``
variable), as are ``criogenai worker``'s own, so each is declared once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, get_args, get_origin

import click
from celery import Celery, signals

from .._config import LOOPBACK, WORKER_OPTIONS, WorkerSettings, option_flag, option_help
from .._errors import ConfigurationError
from ..runner import CallObserver
from ..tools import ToolRegistry


def _default(name: str) -> Any:
    """The option's default, read when the command runs: its variable, else the setting's default."""
    return lambda: getattr(WorkerSettings.from_env(), name)


def worker_options() -> list[click.Option]:
    """criogenai's options of ``celery worker``, one per name in ``WORKER_OPTIONS``."""
    options = []
    for name in WORKER_OPTIONS:
        field = WorkerSettings.model_fields[name]
        flag = option_flag(name)
        text = f"criogenai: {option_help(name)}"
        if field.annotation is bool:
            options.append(click.Option([f"{flag}/--no-{flag[2:]}"], default=_default(name), help=text))
            continue
        kind: Any = field.annotation
        if get_origin(kind) is Literal:
            kind = click.Choice(get_args(kind))
        options.append(click.Option([flag], type=kind, default=_default(name), help=text))
    return options


def default_queues(registry: ToolRegistry) -> list[str]:
    """The queues a worker serves when ``-Q`` does not say: ``$CRIOGENAI_QUEUES``, else its tools'."""
    return list(WorkerSettings.from_env().queues) or sorted({t.queue for t in registry})


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
    app.criogenai_max_abandoned_threads = int(options.get("max_abandoned_threads") or 0)  # the pool's
    level = options.get("loglevel") or "INFO"
    level_name = logging.getLevelName(level) if isinstance(level, int) else str(level).upper()
    if options.get("log_format") == "json":
        from .._logging import install_json_logging

        _observe(app, install_json_logging(app, level_name))
        worker.quiet = True  # no banner: every line on the output is JSON
    port = options.get("metrics_port") or 0
    if port:
        from .._metrics import serve_metrics

        host = options.get("metrics_host") or LOOPBACK
        _observe(app, serve_metrics(app, int(port), registry.names(), host, broker_url=app.conf.broker_url))
    if options.get("health_port"):
        from ._health import serve_health

        host = options.get("health_host") or LOOPBACK
        serve_health(worker, redis_url, int(options["health_port"]), host)
    if options.get("otel"):
        from .._tracing import instrument_worker

        instrument_worker(_pool_name(options, app), WorkerSettings.from_env().otel_spans_file)


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
