"""create_app: the only place that configures Celery, with the settings criogenai relies on.

JSON only; late acks with a prefetch of one, so a running call holds its own slot and a message
is redelivered if its worker dies; failures and hard timeouts acknowledged (terminal), so a call
that always times out cannot loop; criogenai's ledger, not the broker, keeps finished calls from
running twice.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import redis
from celery import Celery

from .._catalog import Catalog, CatalogPublisher
from .._config import Settings
from .._errors import ConfigurationError
from .._keys import DEFAULT_QUEUE, TASK_NAME
from .._metrics import stamp_published_calls
from .._refusals import refusal
from .._signing import key_id
from ..tools import ToolRegistry
from ._credentials import CONSUMER, TRANSPORT
from ._ledger import Ledger, MemoryLedger, RedisLedger
from ._options import install as install_worker_options
from ._task import WorkerRuntime, register


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


MIN_REDIS = (7, 0)
"""BLMPOP, which workers and dispatchers pop with, came with Redis 7.0."""


def redis_version_ok(version: str) -> bool:
    """Whether a server's ``redis_version`` is one criogenai runs on."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= MIN_REDIS


def check_server(ledger: Ledger, *, login: bool = True) -> None:
    """Fail fast when Redis is older than 7.0 (every pop would fail) and, with ``login``, when it
    refuses the URL's credentials or certificate (a dispatcher instead ends its calls with the
    reason). Redis not up yet is left to the retries; a later refusal stops the worker then
    (``_credentials``)."""
    if not isinstance(ledger, RedisLedger):
        return
    try:
        ledger.client.ping()
        version = str(ledger.client.info("server").get("redis_version", ""))
    except redis.ConnectionError as exc:
        why = refusal(exc, fresh=True)
        if login and why is not None:
            raise ConfigurationError(why) from None
        return
    except redis.RedisError:  # INFO not allowed for this user: nothing to check against
        return
    if version and not redis_version_ok(version):
        raise ConfigurationError(
            f"criogenai needs Redis 7.0 or newer (it pops with BLMPOP); the server runs {version}"
        )


def _drop_builtin_tasks(app: Celery) -> None:
    """Unregister Celery's own tasks (``celery.chord_unlock``, ``celery.map``, ...): criogenai
    sends only its call task, and a message naming any other is then refused as unregistered
    before any code runs, instead of reaching tasks that call others or retry forever."""
    for name in [n for n in app.tasks if n != TASK_NAME]:
        app.tasks.unregister(name)


def make_ledger(settings: Settings) -> Ledger:
    if settings.redis_url:
        return RedisLedger(
            settings.redis_url,
            prefix=settings.key_prefix,
            lease_secs=settings.lease_secs,
            retention_secs=settings.retention_secs,
            celery_records=settings.celery_result_records,
            celery_results=settings.redis_url == settings.result_backend,
            broker_acks=settings.redis_url == settings.broker_url,
        )
    return MemoryLedger(lease_secs=settings.lease_secs)


def create_app(
    settings: Settings, registry: ToolRegistry | None = None, ledger: Ledger | None = None
) -> Celery:
    """A Celery app for criogenai; with a registry, also the task that runs its tools."""
    stamp_published_calls()
    app = Celery("criogenai", set_as_current=False)
    app.conf.update(_celery_conf(settings))
    if registry is not None:
        ledger = ledger or make_ledger(settings)
        check_server(ledger)
        runtime = WorkerRuntime(app, registry, ledger, signing_secret=settings.signing_secret)
        register(app, runtime)
        # criogenai's settings for `criogenai worker` and `celery -A criogenai.worker worker` alike
        install_worker_options(app, registry, settings.redis_url)
        _drop_builtin_tasks(app)
        if isinstance(runtime.ledger, RedisLedger):  # a fleet: publish the tools it serves
            catalog = Catalog(runtime.ledger.client, prefix=settings.key_prefix)
            runtime.on_heartbeat = CatalogPublisher(catalog, registry, key_id=key_id(settings.signing_secret))
        app.criogenai_runtime = runtime
    return app
