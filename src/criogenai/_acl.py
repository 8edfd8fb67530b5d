"""The least-privilege Redis ACL user a fleet (workers and agent processes) runs under.

One definition, rendered for the README and used by the test that runs a whole fleet under it
with an empty ``ACL LOG`` (``tests/integration/test_acl.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._keys import (
    CELERY_META,
    DEFAULT_QUEUE,
    KOMBU_BINDINGS,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    KOMBU_UNACKED_MUTEX,
    PIDBOX,
    Keys,
)

FLEET_COMMANDS = (
    "ping", "info", "select",
    # queues (kombu's, with their priority lists), reply lists, agent run records
    "lpush", "rpush", "brpop", "blmpop", "llen", "lrange",
    # kombu's routing table; heartbeats, limits, the catalog, approvals, unacknowledged messages
    "sadd", "srem", "smembers",
    "zadd", "zrem", "zcard", "zrank", "zscore", "zrange", "zrangebyscore", "zremrangebyscore",
    "hset", "hsetnx", "hget", "hmget", "hgetall", "hdel", "hexists", "hincrby", "hlen", "hvals",
    "get", "set", "setex", "mget", "del", "exists", "expire", "pexpire", "incr",
    "multi", "exec",
    # the ledger's, limits', approvals' and kombu's scripts (the commands they run are checked too)
    "eval", "evalsha", "script|load", "script|exists", "time",
    # Celery's remote control (pidbox) and events; a result's announcement to Celery clients
    "publish", "psubscribe", "punsubscribe",
)


def fleet_acl_rules(
    *, db: int = 0, queues: Sequence[str] = (DEFAULT_QUEUE,), prefix: str = "crg"
) -> list[str]:
    """``ACL SETUSER`` rules (after the user's name and password) for a fleet on database ``db``
    serving ``queues``, with criogenai's keys under ``prefix``.

    kombu names its fanout channels ``/{db}.<exchange>``. A worker PSUBSCRIBEs to the remote control
    channel ``/{db}.celery.pidbox``, and Redis 7 allows a pattern subscription only to a pattern
    the user's channel rules name exactly, so that one is named on its own.
    """
    keys = [
        # the ledger, replies, heartbeats, catalog, limits, approvals, run records, cache, memories
        f"~{Keys(prefix).pattern()}",
        *(f"~{queue}*" for queue in queues),  # a queue list and kombu's priority lists beside it
        f"~{KOMBU_BINDINGS}*",  # kombu's routing table
        # kombu's unacknowledged messages
        f"~{KOMBU_UNACKED}", f"~{KOMBU_UNACKED_INDEX}", f"~{KOMBU_UNACKED_MUTEX}",
        f"~{CELERY_META}*",  # Celery's result records, which the ledger also writes
        f"~*{PIDBOX}*",  # remote control: each worker's queue, and the replies to commands
    ]
    channels = [
        f"&/{db}{PIDBOX}",  # remote control, named exactly (see above)
        f"&/{db}.celeryev/*",  # events (``criogenai worker --events``, for Flower)
        f"&{CELERY_META}*",  # a result's announcement (``AsyncResult.get``)
    ]
    return ["resetkeys", "resetchannels", "-@all", *(f"+{c}" for c in FLEET_COMMANDS), *keys, *channels]


def acl_setuser(user: str = "criogenai", password: str = "PASSWORD", **kw: object) -> str:
    """The ``ACL SETUSER`` command for a fleet's user (``fleet_acl_rules``'s arguments in ``kw``)."""
    rules = fleet_acl_rules(**kw)  # type: ignore[arg-type]
    return " ".join(["ACL SETUSER", user, "on", f">{password}", *rules])
