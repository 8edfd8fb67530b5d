"""create_app: the worker's Celery app (``_celery``'s configuration) with the task that runs its tools."""

from __future__ import annotations

from celery import Celery

from .._celery import celery_app
from .._config import Settings
from .._keys import TASK_NAME
from .._signing import key_id
from ..store import CatalogPublisher, Ledger, check_server, ledger_catalog, make_ledger
from ..tools import ToolRegistry
from ._options import install as install_worker_options
from ._task import WorkerRuntime, register


def _drop_builtin_tasks(app: Celery) -> None:
    """Unregister Celery's own tasks (``celery.chord_unlock``, ``celery.map``, ...): criogenai
    sends only its call task, and a message naming any other is then refused as unregistered
    before any code runs, instead of reaching tasks that call others or retry forever."""
    for name in [n for n in app.tasks if n != TASK_NAME]:
        app.tasks.unregister(name)


def create_app(
    settings: Settings, registry: ToolRegistry | None = None, ledger: Ledger | None = None
) -> Celery:
    """A Celery app for criogenai; with a registry, also the task that runs its tools."""
    app = celery_app(settings)
    if registry is not None:
        ledger = ledger or make_ledger(settings)
        check_server(ledger)
        runtime = WorkerRuntime(app, registry, ledger, signing_secret=settings.signing_secret)
        register(app, runtime)
        # criogenai's settings for `criogenai worker` and `celery -A criogenai.worker worker` alike
        install_worker_options(app, registry, settings.redis_url)
        _drop_builtin_tasks(app)
        catalog = ledger_catalog(runtime.ledger)
        if catalog is not None:  # a fleet: publish the tools it serves
            runtime.on_heartbeat = CatalogPublisher(catalog, registry, key_id=key_id(settings.signing_secret))
        app.criogenai_runtime = runtime
    app.criogenai_settings = settings
    return app
