"""Names shared by the dispatcher and the worker: the Celery task, the queue, the Redis keys.

Every Redis key criogenai reads or writes is named here: its own under one prefix (``Keys``), and
the Celery and kombu keys it touches (their names, which criogenai keeps). Every key of one run
carries the run id in a hash tag (``{...}``), so a run's keys share one Redis Cluster slot. The
fleet as a whole does not run on Redis Cluster: kombu's queues, its unacked set and Celery's
result records (which the ledger's ``finish`` also writes) do not.
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

    def pattern(self) -> str:
        """A glob of every key below (an ACL's key rule, say)."""
        return f"{self.prefix}:*"

    def results(self, run_id: str) -> str:
        """Hash: call id → ToolResult JSON of every finished call of the run."""
        return f"{self.prefix}:{{{run_id}}}:results"

    def failed(self, run_id: str) -> str:
        """Hash: call id → ToolResult JSON of calls that failed the run (``fail``) or whose message
        was refused; a re-dispatch of the turn may run them again."""
        return f"{self.prefix}:{{{run_id}}}:failed"

    def claim(self, run_id: str, call_id: str) -> str:
        """String ``run:<token>`` (a worker runs it) or ``wait:<token>`` (its retry is due), with a
        lease TTL: the only key of a single call, and only while it is unfinished. The token is
        one delivery's own (``CallRunner``), never shared by two deliveries of the call."""
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

    def approvals(self, run_id: str) -> str:
        """Hash: call id → ``PendingApproval`` JSON, of the run's calls put to a person."""
        return f"{self.prefix}:{{{run_id}}}:approvals"

    def approval_runs(self) -> str:
        """Sorted set: run id → when it first asked, to list approvals across runs."""
        return f"{self.prefix}:approvals"

    def run_messages(self, run_id: str) -> str:
        """List: an agent run's ``RunEntry`` JSON, one per message, in order."""
        return f"{self.prefix}:{{{run_id}}}:agent:messages"

    def run_state(self, run_id: str) -> str:
        """String: an agent run's ``RunState`` JSON."""
        return f"{self.prefix}:{{{run_id}}}:agent:state"

    def cached(self, tool: str, schema_hash: str, digest: str) -> str:
        """String, with the cache's TTL: a ``ToolResult`` JSON for one read-only call (``digest``:
        of its arguments' canonical JSON)."""
        return f"{self.prefix}:cache:{tool}:{schema_hash}:{digest}"

    def catalog(self) -> str:
        """Sorted set: tool name → when a worker last published it."""
        return f"{self.prefix}:catalog:tools"

    def catalog_tool(self, name: str) -> str:
        """Hash: worker → ``CatalogEntry`` JSON, of one tool."""
        return f"{self.prefix}:catalog:tool:{name}"

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


# -- Celery's and kombu's keys, as their Redis backend and transport name them -----------------------

CELERY_META = "celery-task-meta-"
"""Celery's result record of a task: ``CELERY_META + task id`` (the ledger's ``finish`` writes it
when asked), also the channel its announcement is published on."""
KOMBU_UNACKED, KOMBU_UNACKED_INDEX, KOMBU_UNACKED_MUTEX = "unacked", "unacked_index", "unacked_mutex"
"""kombu's unacknowledged messages (hash: delivery tag → message; sorted set: tag → when taken), and
the lock of their restoration. kombu's defaults, which criogenai keeps."""
KOMBU_BINDINGS = "_kombu.binding"
"""kombu's routing table: a set per exchange, ``_kombu.binding.<exchange>``."""
PIDBOX = ".celery.pidbox"
"""Celery's remote control: each worker's queue and the replies end with it."""
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
"""kombu's Redis transport keeps a queue in the list named as the queue, and messages sent with a
priority in lists ``<queue>\x06\x16<step>`` beside it; criogenai publishes at priority 0."""


POP_BREAKS_TTL_SECS = 86_400
"""How long a queue's pop-break counter outlives its last break (a dispatcher sees any change)."""


def pop_breaks(queue: str) -> str:
    """Counter a worker raises after its connection broke while it was popping ``queue``: the reply
    carrying the messages Redis took off the queue may have been lost. Dispatchers watching it send
    that queue's unstarted calls again. Beside the queue, on the broker, named by the queue alone
    (the worker's transport knows no key prefix)."""
    return f"criogenai:pop-breaks:{queue}"


def queue_list(queue: str, step: int = 0) -> str:
    """The Redis list of a queue's messages of one priority step (0: the queue's own name)."""
    return queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}"


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold a queue's waiting messages, priority lists included."""
    return [queue_list(queue, step) for step in PRIORITY_STEPS]
