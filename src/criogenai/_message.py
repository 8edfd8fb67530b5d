"""How one validated call becomes a Celery message: its task id, queue, limits and display name.

The dispatcher publishes with it, and a worker's main process re-publishes with it when a call's
process died under it; both must send the same message for the same call.
"""

from __future__ import annotations

from typing import Any

from ._keys import TASK_NAME, task_id
from ._tracing import trace_headers
from ._wire import ToolTask

SENT_AT_HEADER = "crg_sent_at"
"""Message header: Unix time from which the call could start (publish time, or a retry's ETA)."""

def hard_limit_secs(timeout_secs: float) -> float:
    """The hard limit that follows a soft limit: a little later, so the soft one gets to act."""
    return timeout_secs + min(10.0, max(1.0, 0.1 * timeout_secs))


def shown_options(payload: ToolTask) -> dict[str, str]:
    """What Flower, the worker's log and its control replies show of a call's message: the tool's
    name and the ids, never the arguments. Celery's retry makes its own otherwise (arguments and all)."""
    return {
        "shadow": f"tool:{payload.call.name}",
        "argsrepr": "()",
        "kwargsrepr": f"{{run_id: {payload.run_id!r}, call_id: {payload.call.id!r}}}",
    }


def task_options(payload: ToolTask) -> dict[str, Any]:
    """The Celery options of a call's message, shared by both ways of publishing it."""
    return {
        "soft_time_limit": payload.timeout_secs,
        "time_limit": hard_limit_secs(payload.timeout_secs),
        **shown_options(payload),
    }


def send_call(
    app: Any, payload: ToolTask, queue: str, *, producer: Any = None, countdown: float | None = None
) -> str:
    """Publish one call as a Celery task; returns its task id."""
    tid = task_id(payload.run_id, payload.call.id)
    app.send_task(
        TASK_NAME,
        kwargs={"task": payload.model_dump(mode="json")},
        task_id=tid,
        queue=queue,
        countdown=countdown,
        producer=producer,
        headers=trace_headers(payload.run_id),  # the turn's trace context, when it is traced
        retry=True,
        retry_policy={
            "max_retries": 5,
            "interval_start": 0.1,
            "interval_step": 0.5,
            "interval_max": 2.0,
        },
        **task_options(payload),
    )
    return tid
