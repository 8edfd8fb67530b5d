"""Plain Celery, as a skilled user writes it: the reference the benchmark compares against.

Same broker and backend, JSON, late acks and a prefetch of one, as criogenai's workers use.
"""

import os
import time

from celery import Celery

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6390/0")

app = Celery("plain", broker=URL, backend=URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_default_queue="plain",
    worker_hijack_root_logger=False,
)


@app.task(name="plain.noop")
def noop(i: int = 0) -> int:
    return i


@app.task(name="plain.wait")
def wait(secs: float = 1.0) -> float:
    time.sleep(secs)
    return secs
