"""The worker side: the Celery app and the task that runs registered tools.

``celery -A criogenai.worker worker`` builds the app on first use from the environment: the tool
modules in ``CRIOGENAI_TOOLS`` (comma-separated) and the broker in ``CRIOGENAI_BROKER_URL``.
"""

from __future__ import annotations

from typing import Any

from ..store import make_ledger
from ._app import create_app

__all__ = ["app", "create_app", "make_ledger"]

_app: Any = None


def __getattr__(name: str) -> Any:
    global _app
    if name in ("app", "celery"):
        if _app is None:
            from .._config import Settings, WorkerSettings
            from ..tools import ToolRegistry

            _app = create_app(Settings.from_env(), ToolRegistry.from_modules(WorkerSettings.from_env().tools))
        return _app
    raise AttributeError(name)
