"""Publishing a turn's calls straight into the Redis queue lists: one round trip per turn.

kombu's producer costs several hundred microseconds of CPU per message and one round trip each.
This builds the same Celery protocol-2 message (``app.amqp.as_task_v2``, the very code
``send_task`` uses) and the same kombu Redis envelope, then LPUSHes every call of a turn in one
pipeline. Workers run unchanged. It handles what criogenai sends: direct routing to a named queue,
priority 0, no countdown. A contract test compares its messages with kombu's own.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._keys import TASK_NAME, pop_breaks, queue_list, task_id
from .._message import task_options
from .._metrics import stamp_sent_at
from .._refusals import refusal
from .._tracing import inject_trace_headers
from .._wire import ToolTask

if TYPE_CHECKING:
    import redis

_RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, None)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class RedisPublisher:
    """Sends calls to a Redis broker as kombu-compatible messages, a batch per pipeline."""

    def __init__(self, app: Any, client: redis.Redis) -> None:
        self._amqp = app.amqp
        self._client = client
        self._origin = f"gen{os.getpid()}@{socket.gethostname()}"
        # kombu uses a uuid4 per message; any unique string serves, and a counter costs no syscall.
        self._tags = itertools.count()
        self._tag_prefix = uuid.uuid4().hex
        self._breaks: dict[str, bytes | None] = {}
        """Each queue's ``pop_breaks`` counter as last read (first with the queue's first publish)."""
        self._breaks_lock = threading.Lock()

    def envelope(self, payload: ToolTask, queue: str) -> str:
        """The JSON text kombu's Redis transport would LPUSH for this call."""
        tid = task_id(payload.run_id, payload.call.id)
        headers, properties, body, _ = self._amqp.as_task_v2(
            tid,
            TASK_NAME,
            args=(),
            kwargs={"task": payload.model_dump(mode="json")},
            origin=self._origin,
            ignore_result=None,  # the worker's task decides (see worker/_task.py)
            **task_options(payload),
        )
        stamp_sent_at(headers)
        inject_trace_headers(headers, payload.run_id)
        properties.update(
            delivery_mode=2,
            priority=0,
            body_encoding="base64",
            delivery_tag=f"{self._tag_prefix}-{next(self._tags)}",
            delivery_info={"exchange": "", "routing_key": queue},
        )
        encoded = base64.b64encode(_dumps(body).encode()).decode()
        return _dumps(
            {
                "body": encoded,
                "content-encoding": "utf-8",
                "content-type": "application/json",
                "headers": headers,
                "properties": properties,
            }
        )

    def publish(self, items: Sequence[tuple[ToolTask, str]]) -> None:
        """Push every (call, queue) in one round trip, one LPUSH per queue, in call order; retried
        briefly if Redis blinks.

        Sending a call twice is harmless (a worker's claim runs it once), so a batch that failed
        half-way is simply sent again.
        """
        import redis

        by_queue: dict[str, list[str]] = {}
        for payload, queue in items:
            by_queue.setdefault(queue, []).append(self.envelope(payload, queue))
        for delay in _RETRY_DELAYS:
            try:
                pipe = self._client.pipeline(transaction=False)
                with self._breaks_lock:
                    unseen = [q for q in by_queue if q not in self._breaks]
                for queue in unseen:  # the baseline, read before the calls can be popped
                    pipe.get(pop_breaks(queue))
                for queue, texts in by_queue.items():
                    pipe.lpush(queue_list(queue), *texts)  # same order as one LPUSH per call
                replies = pipe.execute()
                with self._breaks_lock:
                    for queue, seen in zip(unseen, replies, strict=False):
                        self._breaks.setdefault(queue, seen)
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if delay is None or refusal(exc) is not None:  # a refusal does not heal by waiting
                    raise
                time.sleep(delay)

    def broken_pops(self, queues: set[str]) -> set[str]:
        """The queues of ``queues`` a worker's pop broke on since last asked (``pop_breaks``): the
        calls of theirs that have not started may have been taken off the queue and lost."""
        names = sorted(q for q in queues if q in self._breaks)
        if not names:
            return set()
        now: list[bytes | None] = self._client.mget([pop_breaks(q) for q in names])  # type: ignore[assignment]
        with self._breaks_lock:
            broke = {q for q, value in zip(names, now, strict=True) if value != self._breaks[q]}
            self._breaks.update(zip(names, now, strict=True))
        return broke
