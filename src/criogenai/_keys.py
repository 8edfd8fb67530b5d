"""Names shared by the dispatcher and the worker: the Celery task, the queue, the Redis keys.

Every key of one run carries the run id in a hash tag (``{...}``), so a run's keys share one
Redis Cluster slot. The fleet as a whole does not run on Redis Cluster: kombu's queues, its
unacked set and Celery's result records (which the ledger's ``finish`` also writes) do not.
"""

from __future__ import annotations

import hashlib

TASK_NAME = "criogenai.call"
DEFAULT_QUEUE = "criogenai"
MAX_LOST_RUNS = 2
"""Runs of one call that may die with their process before the call ends ``lost``."""


def task_id(run_id: str, call_id: str) -> str:
    """The Celery task id of a call: the same for the same (run, call), on every dispatch."""
    digest = hashlib.sha256(f"{len(run_id)}:{run_id}:{call_id}".encode()).hexdigest()[:32]
    return f"crg-{digest}"


class Keys:
    """Redis key names under one prefix."""

    def __init__(self, prefix: str = "crg") -> None:
        self.prefix = prefix

    def results(self, run_id: str) -> str:
        """Hash: call id → ToolResult JSON of every finished call of the run."""
        return f"{self.prefix}:{{{run_id}}}:results"

    def failed(self, run_id: str) -> str:
        """Hash: call id → ToolResult JSON of calls that failed the run (``fail``) or whose message
        was refused; a re-dispatch of the turn may run them again."""
        return f"{self.prefix}:{{{run_id}}}:failed"

    def claim(self, run_id: str, call_id: str) -> str:
        """String ``run:<token>`` (a worker runs it) or ``wait:<token>`` (its retry is due), with a
        lease TTL: the only key of a single call, and only while it is unfinished."""
        return f"{self.prefix}:{{{run_id}}}:claim:{call_id}"

    def starts(self, run_id: str) -> str:
        """Hash: call id → runs started, for the run's unfinished calls (a field goes when its call
        finishes, so a run whose calls all finished leaves no such key)."""
        return f"{self.prefix}:{{{run_id}}}:starts"

    def stopped(self, run_id: str) -> str:
        """Hash: call id → why no message of the call may start any more in this dispatch of the
        turn: ``gave_up`` (its dispatcher reported it ``not_started``, ``lost`` or ``cancelled``)
        or ``failed`` (it failed the turn). ``prepare`` (a re-dispatch) lifts it."""
        return f"{self.prefix}:{{{run_id}}}:stopped"

    def reply(self, dispatcher_id: str) -> str:
        """List a dispatcher waits on: the results of the calls it published."""
        return f"{self.prefix}:reply:{dispatcher_id}"

    def workers(self, queue: str) -> str:
        """Sorted set: worker name → time of its last heartbeat, for one queue."""
        return f"{self.prefix}:workers:{queue}"

    def cancel(self, run_id: str) -> str:
        """String set when the run was cancelled: no call of it starts, running ones stop."""
        return f"{self.prefix}:{{{run_id}}}:cancel"

    def limit(self, gate: str, part: str) -> str:
        """A fleet-wide gate (``tool:<name>``, ``tenant:<name>``, ``rate:...``): ``hold`` (sorted set:
        holder → end of its place, ms), ``wait`` (holder → ticket), ``alive`` (waiter → liveness end, ms).
        One hash tag for every gate, so that one script can take places in several at once."""
        return f"{self.prefix}:{{limits}}:{gate}:{part}"

    def memories(self, namespace: str, scope: str) -> str:
        """Hash: memory id → record JSON, of one scope (user) of one memory namespace. Expires its
        retention after the last write."""
        return f"{self.prefix}:mem:{{{namespace}:{scope}}}"
