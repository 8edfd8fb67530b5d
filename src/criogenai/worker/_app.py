"""create_app: the only place that configures Celery, with the settings criogenai relies on.

JSON only; late acks with a prefetch of one, so a running call holds its own slot and a message
is redelivered if its worker dies; failures and hard timeouts acknowledged (terminal), so a call
that always times out cannot loop; criogenai's ledger, not the broker, keeps finished calls from
running twice.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from .._config import Settings
from .._keys import DEFAULT_QUEUE
from ..tools import ToolRegistry
from ._ledger import Ledger, MemoryLedger, RedisLedger
from ._task import WorkerRuntime, register
from ._transport import TRANSPORT


def _celery_conf(settings: Settings) -> dict[str, Any]:
    vt = settings.visibility_timeout_secs
    socket_opts = {
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 10,
        "retry_on_timeout": True,
    }
    conf: dict[str, Any] = {
        "broker_url": settings.broker_url or "memory://",
        "result_backend": settings.result_backend or "cache+memory://",
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_default_queue": DEFAULT_QUEUE,
        "task_acks_late": True,
        "task_acks_on_failure": True,
        "task_acks_on_timeout": True,
        "task_reject_on_worker_lost": False,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_track_started": False,
        "result_extended": False,
        "result_expires": settings.retention_secs,
        "result_backend_always_retry": True,
        "result_backend_max_retries": 10,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "visibility_timeout": vt,
        "broker_transport_options": {"visibility_timeout": vt, **socket_opts},
        "result_backend_transport_options": {"visibility_timeout": vt},
        "redis_socket_timeout": 15,
        "redis_socket_connect_timeout": 5,
        "redis_backend_health_check_interval": 10,
        "worker_hijack_root_logger": False,
        "enable_utc": True,
    }
    if (settings.broker_url or "").startswith("redis://"):
        conf["broker_transport"] = TRANSPORT
    return conf


def make_ledger(settings: Settings) -> Ledger:
    if settings.redis_url:
        return RedisLedger(
            settings.redis_url,
            prefix=settings.key_prefix,
            lease_secs=settings.lease_secs,
            retention_secs=settings.retention_secs,
        )
    return MemoryLedger(lease_secs=settings.lease_secs)


def create_app(
    settings: Settings, registry: ToolRegistry | None = None, ledger: Ledger | None = None
) -> Celery:
    """A Celery app for criogenai; with a registry, also the task that runs its tools."""
    app = Celery("criogenai", set_as_current=False)
    app.conf.update(_celery_conf(settings))
    if registry is not None:
        runtime = WorkerRuntime(app, registry, ledger or make_ledger(settings))
        register(app, runtime)
        app.criogenai_runtime = runtime
    return app
