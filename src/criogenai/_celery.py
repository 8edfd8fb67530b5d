"""Celery's configuration for criogenai, in one place: the app a dispatcher publishes with and the
one a worker runs its task in are both made here (``celery_app``), with the settings criogenai
relies on.

JSON only; late acks with a prefetch of one, so a running call holds its own slot and a message
is redelivered if its worker dies; failures and hard timeouts acknowledged (terminal), so a call
that always times out cannot loop; criogenai's ledger, not the broker, keeps finished calls from
running twice. Imported only by the fleet side: ``import criogenai`` without a broker never loads it.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from celery import Celery

from ._config import Settings
from ._keys import DEFAULT_QUEUE
from ._metrics import stamp_published_calls

TRANSPORT = "criogenai.worker._credentials:Transport"
"""The kombu transport of a Redis broker (``worker._credentials``): refused credentials are not
retried for ever. Named here, not imported, so that a dispatcher's app does not import the worker."""
CONSUMER = "criogenai.worker._credentials:Consumer"
"""The worker's consumer (``worker._credentials``): refused credentials end the worker."""


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
        "worker_disable_rate_limits": True,  # fleet-wide limits are the dispatcher's (Limits)
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
        "worker_consumer": CONSUMER,  # refused credentials end the worker, not retried for ever
        "enable_utc": True,
    }
    if (settings.broker_url or "").startswith(("redis://", "rediss://")):
        conf["broker_transport"] = TRANSPORT
    if _unverified_tls(settings.broker_url):
        conf["broker_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if _unverified_tls(settings.result_backend):
        conf["redis_backend_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return conf


def _unverified_tls(url: str | None) -> bool:
    """A ``rediss://`` URL that does not say how to check the server's certificate.

    kombu would then connect without checking it at all; criogenai checks it against the system's
    CAs instead (as redis-py does for the ledger). Say otherwise in the URL: ``?ssl_cert_reqs=
    required&ssl_ca_certs=/path/ca.crt`` (``ssl_certfile`` and ``ssl_keyfile`` for client certs).
    """
    if not (url or "").startswith("rediss://"):
        return False
    return "ssl_cert_reqs" not in dict(parse_qsl(urlsplit(url or "").query))


def celery_app(settings: Settings) -> Celery:
    """A Celery app configured for criogenai, with no task yet (a dispatcher publishes with it)."""
    stamp_published_calls()
    app = Celery("criogenai", set_as_current=False)
    app.conf.update(_celery_conf(settings))
    return app
