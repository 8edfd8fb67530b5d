"""Structured worker logs: one JSON object per line, carrying the ids of the call being run.

``criogenai worker --log-format json`` installs it. While a call runs, every record logged on its
thread (the engine's and the tool's own) gets the run id, call id and tool; when the call ends, one
``call finished`` record adds the attempt, the status and the duration.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

from celery import Celery, signals

from ._keys import TASK_NAME
from .runner._outcomes import call_report

FIELDS = ("run_id", "call_id", "tool", "attempt", "status", "duration_secs", "task_id", "worker")
"""Record attributes copied into the JSON object when present."""

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "criogenai_call", default=None
)
"""The running call's fields: per thread, and per greenlet (calls on the threads pool share one)."""
log = logging.getLogger("criogenai.calls")


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON: time, level, logger, message, the call's fields, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class CallContext(logging.Filter):
    """Adds the running call's ids to records logged while it runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_current.get() or {}).items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def json_handler(level: str | int = "INFO") -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(CallContext())
    handler.setLevel(level if isinstance(level, int) else level.upper())
    return handler


def install_json_logging(app: Celery, level: str = "INFO") -> None:
    """Send every log record of this process (and its pool children) to stderr as JSON lines."""
    handler = json_handler(level)

    @signals.setup_logging.connect(weak=False)  # type: ignore[untyped-decorator]
    def _setup(**_: Any) -> None:  # connected: Celery leaves logging to us
        root = logging.getLogger()
        root.handlers = [handler]
        root.setLevel(level.upper())

    _setup()
    logging.captureWarnings(True)  # Python's warnings as JSON records too
    _track_calls(app)


def _call_fields(kwargs: Any) -> dict[str, Any]:
    body = (kwargs or {}).get("task") if isinstance(kwargs, dict) else None
    call = body.get("call") if isinstance(body, dict) else None
    if not isinstance(body, dict) or not isinstance(call, dict):
        return {}
    return {"run_id": body.get("run_id"), "call_id": call.get("id"), "tool": call.get("name")}


def _track_calls(app: Celery) -> None:
    @signals.task_prerun.connect(weak=False)  # type: ignore[untyped-decorator]
    def _started(sender: Any = None, task_id: str = "", kwargs: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == TASK_NAME and getattr(sender, "app", None) is app:
            _current.set({**_call_fields(kwargs), "task_id": task_id})

    @signals.task_postrun.connect(weak=False)  # type: ignore[untyped-decorator]
    def _ended(sender: Any = None, retval: Any = None, state: str = "", **_: Any) -> None:
        if getattr(sender, "name", None) != TASK_NAME or getattr(sender, "app", None) is not app:
            return
        try:
            extra: dict[str, Any] = {"status": (state or "").lower() or None}
            report = call_report(retval)
            if report is not None:
                extra = {
                    "status": report.status,
                    "attempt": report.attempts,
                    "duration_secs": report.duration_secs,
                }
            log.info("call finished", extra=extra)
        finally:
            _current.set(None)
