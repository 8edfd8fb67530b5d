"""The call runner, shared by the worker's Celery task and the embedded engine: one delivery of a
call from refusal check to filing (``_call``), one attempt of it (``_executor``), the outcomes and
results it is filed with (``_outcomes``), the leases of running calls (``_leases``) and what
observers are told (``_observe``). It imports neither side, and no Celery."""

from ._call import Answered, CallRunner, Delivery, NotRun, Refused, RunAgain, Step, StoreAway
from ._executor import abandoned_threads, on_abandoned
from ._observe import CallObserver, current_call

__all__ = [
    "Answered",
    "CallObserver",
    "CallRunner",
    "Delivery",
    "NotRun",
    "Refused",
    "RunAgain",
    "Step",
    "StoreAway",
    "abandoned_threads",
    "current_call",
    "on_abandoned",
]
