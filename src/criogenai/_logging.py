"""Structured worker logs: one JSON object per line, carrying the ids of the call being run.

``criogenai worker --log-format json`` installs it. While a call runs, every record logged on its
thread (the engine's and the tool's own) gets the run id, call id and tool; when the call ends, one
``call finished`` record adds the attempt, the status and the duration.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from celery import Celery, signals

from ._wire import ToolResult, ToolTask
from .runner import CallObserver, current_call
from .runner._outcomes import Outcome

FIELDS = ("run_id", "call_id", "tool", "attempt", "status", "duration_secs", "task_id", "worker")
"""Record attributes copied into the JSON object when present."""

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
        for name, value in current_call().items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def json_handler(level: str | int = "INFO") -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(CallContext())
    handler.setLevel(level if isinstance(level, int) else level.upper())
    return handler


def install_json_logging(app: Celery, level: str = "INFO") -> CallLog:
    """Send every log record of this process (and its pool children) to stderr as JSON lines;
    returns the observer that logs each call's end (the worker gives it to its runner)."""
    handler = json_handler(level)

    @signals.setup_logging.connect(weak=False)  # type: ignore[untyped-decorator]
    def _setup(**_: Any) -> None:  # connected: Celery leaves logging to us
        root = logging.getLogger()
        root.handlers = [handler]
        root.setLevel(level.upper())

    _setup()
    logging.captureWarnings(True)  # Python's warnings as JSON records too
    return CallLog()


class CallLog(CallObserver):
    """One ``call finished`` record per delivery that ends a call or sends it to run again."""

    def run_ended(self, payload: ToolTask, outcome: Outcome, attempt: int, retry_in: float | None) -> None:
        if retry_in is not None:
            log.info("call finished", extra={"status": "retry", "attempt": attempt,
                                             "duration_secs": outcome.duration_secs})

    def call_ended(self, payload: ToolTask, result: ToolResult) -> None:
        log.info("call finished", extra={"status": result.status, "attempt": result.attempts,
                                         "duration_secs": result.duration_secs or 0.0})
