"""kombu's Redis transport, hardened against two ways kombu 5.7 takes a whole worker down, and lighter.

1. It decodes the envelope of every BRPOP'd entry outside any error handling, so one garbage
   LPUSH into a queue crashes the worker ("Unrecoverable error: JSONDecodeError"). The queue is
   shared infrastructure: a worker must refuse such an entry, say so, and go on.
2. When the connection to Redis is lost while messages are unacknowledged (a Redis restart in
   the middle of calls), closing the channel tries to restore them through the closed connection
   and raises AttributeError, which Celery treats as unrecoverable: the worker exits instead of
   reconnecting. Those messages cannot be restored anyway (the server is gone); criogenai's
   dispatcher sends lost calls again, so here the failure is logged and the worker reconnects.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.transport.virtual import Empty
from kombu.utils import json as kombu_json

log = logging.getLogger(__name__)

# kombu's typing varies between releases; subclass through Any so the checks are stable.
_RedisQoS: Any = kombu_redis.QoS
_VirtualQoS: Any = virtual.QoS
_kombu_dumps: Any = kombu_json.dumps
_RedisChannel: Any = kombu_redis.Channel
_RedisTransport: Any = kombu_redis.Transport


_acked_with_result: set[str] = set()
"""Delivery tags whose unacked entries the ledger's ``finish`` already removed (see there)."""


def acked_with_result(delivery_tag: str) -> None:
    """The call's result was filed and its message acknowledged in Redis in one step: kombu's
    coming ack only needs its in-memory bookkeeping."""
    _acked_with_result.add(delivery_tag)


class QoS(_RedisQoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        """kombu's unacked bookkeeping (ZADD to the index, HSET of the message), the same two
        commands, sent on a connection of this QoS's own instead of a redis-py transaction
        pipeline, whose machinery was a third of the worker's CPU per call. No MULTI: a reader
        (``restore_visible``) only takes entries older than the visibility timeout."""
        if getattr(self.channel, "global_keyprefix", ""):  # kombu prefixes keys in its client
            return super().append(message, delivery_tag)  # type: ignore[no-any-return]
        delivery = message.delivery_info
        entry = [message._raw, delivery["exchange"], delivery["routing_key"]]
        try:
            raw = json.dumps(entry)  # the C encoder; the same text for plain JSON values
        except TypeError:  # a value kombu's decoder turned into an object (a datetime, ...)
            raw = _kombu_dumps(entry)
        conn = self.__dict__.get("_crg_conn")
        if conn is None:
            conn = self._crg_conn = self.channel.client.connection_pool.make_connection()
        try:
            conn.send_packed_command(
                conn.pack_commands(
                    [
                        ("ZADD", self.unacked_index_key, time.time(), delivery_tag),
                        ("HSET", self.unacked_key, delivery_tag, raw),
                    ]
                )
            )
            for _ in range(2):
                reply = conn.read_response()
                if isinstance(reply, Exception):
                    raise reply
        except BaseException:
            conn.disconnect()  # a half-read reply must not be taken for the next one's
            raise
        _VirtualQoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in _acked_with_result:
            _acked_with_result.discard(delivery_tag)
            # With a key prefix the ledger removed nothing (it writes kombu's default names).
            if not getattr(self.channel, "global_keyprefix", ""):
                _VirtualQoS.ack(self, delivery_tag)  # the in-memory part of kombu's ack, no round trip
                return
        super().ack(delivery_tag)

    def restore_unacked(self, client: Any = None) -> Any:
        try:
            return super().restore_unacked(client)
        except AttributeError:
            log.warning("lost the broker with unacknowledged messages; they could not be restored "
                        "here and are left to the dispatcher's redelivery")
            return None


class Channel(_RedisChannel):
    QoS = QoS

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        # kombu builds a new redis.Redis (registering ~170 response callbacks) twice per message,
        # for the unacked bookkeeping and the ack: a third of the worker's CPU on small calls. A
        # client is a thread-safe facade over the channel's pool, so one serves every caller.
        if client is None:
            client = self.__dict__.get("_crg_client")
            if client is None:
                client = self._crg_client = self._create_client()
        yield client

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error("refused a queue entry that is not a kombu message (%s: %s); dropped",
                      type(exc).__name__, exc)
            raise Empty() from None


class Transport(_RedisTransport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
