"""kombu's Redis transport, hardened against two ways kombu 5.7 takes a whole worker down, and lighter.

1. It decodes the envelope of every BRPOP'd entry outside any error handling, so one garbage
   LPUSH into a queue crashes the worker ("Unrecoverable error: JSONDecodeError"). The queue is
   shared infrastructure: a worker must refuse such an entry, say so, and go on. And a message
   Celery's consumer raises on (a header or body of the wrong type) kept its slot of the prefetch
   window for ever: here every message is a Celery task message criogenai could have sent
   (``task_refusal``) or is released.
2. When the connection to Redis is lost while messages are unacknowledged (a Redis restart in
   the middle of calls), closing the channel tries to restore them through the closed connection
   and raises AttributeError, which Celery treats as unrecoverable: the worker exits instead of
   reconnecting. Those messages cannot be restored anyway (the server is gone); criogenai's
   dispatcher sends lost calls again, so here the failure is logged and the worker reconnects.

Lighter: one Redis client per channel; messages popped up to the prefetch window in one BLMPOP
and their unacknowledged entries written in one round trip; that bookkeeping as plain commands on
a connection of the QoS's own. Each step writes kombu's own keys and entries, and gives way to
kombu's code when a ``global_keyprefix`` is set.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.transport.virtual import Empty
from kombu.utils import encoding as kombu_encoding
from kombu.utils import json as kombu_json

from .._keys import POP_BREAKS_TTL_SECS, pop_breaks

log = logging.getLogger(__name__)

# kombu's typing varies between releases; subclass through Any so the checks are stable.
_RedisQoS: Any = kombu_redis.QoS
_VirtualQoS: Any = virtual.QoS
_kombu_dumps: Any = kombu_json.dumps
_kombu_loads: Any = kombu_json.loads
_text: Any = kombu_encoding.bytes_to_str
_RedisChannel: Any = kombu_redis.Channel
_RedisTransport: Any = kombu_redis.Transport


ACKED_TAGS_KEPT = 10_000
"""The most delivery tags remembered as acknowledged with their result: far more than a worker
has calls finishing at once (each tag goes at its ack, a moment later)."""


class _AckedTags:
    """Delivery tags whose unacked entries the ledger's ``finish`` already removed, until
    Celery's ack of each. Bounded: an ack that never comes (its connection lost meanwhile) must
    not keep its tag for the worker's life. The oldest go first; an ack whose tag went takes
    kombu's own way, removing entries already removed: a round trip, never a wrong answer."""

    def __init__(self, keep: int = ACKED_TAGS_KEPT) -> None:
        self._keep = keep
        self._tags: dict[str, None] = {}  # insertion-ordered: the oldest first
        self._lock = threading.Lock()  # added on the event loop's thread, taken on Celery's

    def add(self, tag: str) -> None:
        with self._lock:
            self._tags[tag] = None
            while len(self._tags) > self._keep:
                del self._tags[next(iter(self._tags))]

    def take(self, tag: str) -> bool:
        """Forget ``tag``; say whether it was remembered."""
        with self._lock:
            return self._tags.pop(tag, False) is None

    def __len__(self) -> int:
        return len(self._tags)


_acked_with_result = _AckedTags()


def acked_with_result(delivery_tag: str) -> None:
    """The call's result was filed and its message acknowledged in Redis in one step: kombu's
    coming ack only needs its in-memory bookkeeping."""
    _acked_with_result.add(delivery_tag)


class _BrokenPops:
    """Queues whose pop was cut by a broken connection, until their ``pop_breaks`` counters are
    raised. Redis may have taken messages off the queue for that pop, and the reply carrying them
    is gone: nobody holds them (not even as unacknowledged), so only their dispatchers, told by
    the counter, can send those calls again instead of waiting out ``queue_wait_secs``. Kept by
    the process, not the channel: the consumer makes a new channel when it reconnects."""

    def __init__(self) -> None:
        self._queues: set[str] = set()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._queues)

    def add(self, queues: Iterator[str] | list[str]) -> None:
        with self._lock:
            self._queues.update(queues)

    def tell(self, pool: Any) -> None:
        """Raise the counters, on a connection of ``pool`` (no kombu key prefix); kept for the next
        pop when Redis does not answer yet."""
        with self._lock:
            queues = set(self._queues)
        try:
            pipe = redis.Redis(connection_pool=pool).pipeline(transaction=False)
            for queue in sorted(queues):
                pipe.incr(pop_breaks(queue))
                pipe.expire(pop_breaks(queue), POP_BREAKS_TTL_SECS)
            pipe.execute()
        except Exception as exc:
            log.debug("could not tell dispatchers of a broken pop yet: %s", exc)
            return
        log.warning("the connection broke while popping %s: their dispatchers send the calls that "
                    "pop may have taken again", ", ".join(sorted(queues)))
        with self._lock:
            self._queues -= queues


_broken_pops = _BrokenPops()


class QoS(_RedisQoS):
    """kombu's Redis QoS, writing the same unacked entries with fewer round trips."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conn: Any = None  # a connection of this QoS's own (the event loop's thread only)
        self._kept: set[str] = set()
        """Delivery tags whose unacked entries ``keep_unacked`` already wrote."""

    def keep_unacked(self, messages: list[tuple[dict[str, Any], str]]) -> None:
        """kombu's unacked bookkeeping for a batch of popped messages, in one round trip; their
        ``append`` then only does the in-memory part. Each entry holds the message's own text."""
        commands: list[tuple[Any, ...]] = []
        now = time.time()
        for payload, text in messages:
            props = payload["properties"]
            delivery = props.get("delivery_info") or {}
            route = json.dumps([delivery.get("exchange"), delivery.get("routing_key")])
            entry = f"[{text},{route[1:]}"  # [message, exchange, routing key], as kombu writes it
            commands.append(("ZADD", self.unacked_index_key, now, props["delivery_tag"]))
            commands.append(("HSET", self.unacked_key, props["delivery_tag"], entry))
        self._send(commands)
        self._kept.update(payload["properties"]["delivery_tag"] for payload, _ in messages)

    def _send(self, commands: list[tuple[Any, ...]]) -> None:
        if self._conn is None:
            self._conn = self.channel.client.connection_pool.make_connection()
        conn = self._conn
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            for _ in commands:
                conn.read_response()  # raises on an error reply
        except BaseException:
            conn.disconnect()  # a half-read reply must not be taken for the next one's
            raise

    def drop_kept(self, delivery_tag: str) -> None:
        """Remove a kept entry whose message was refused: it must not be restored."""
        if delivery_tag not in self._kept:  # not written yet: a single pop's is written by ``append``
            return
        self._kept.discard(delivery_tag)
        self._send([("ZREM", self.unacked_index_key, delivery_tag), ("HDEL", self.unacked_key, delivery_tag)])

    def forget_kept(self, messages: list[tuple[dict[str, Any], str]]) -> None:
        """A batch was handed on: tags ``append`` did not see (a message not delivered) go."""
        self._kept.difference_update(payload["properties"]["delivery_tag"] for payload, _ in messages)

    def append(self, message: Any, delivery_tag: str) -> None:
        """kombu's unacked bookkeeping (ZADD to the index, HSET of the message), the same two
        commands, sent on a connection of this QoS's own instead of a redis-py transaction
        pipeline, whose machinery was a third of the worker's CPU per call. No MULTI: a reader
        (``restore_visible``) only takes entries older than the visibility timeout."""
        if delivery_tag in self._kept:  # written with its batch (``keep_unacked``)
            self._kept.discard(delivery_tag)
            return _VirtualQoS.append(self, message, delivery_tag)  # type: ignore[no-any-return]
        if getattr(self.channel, "global_keyprefix", ""):  # kombu prefixes keys in its client
            return super().append(message, delivery_tag)  # type: ignore[no-any-return]
        delivery = message.delivery_info
        entry = [message._raw, delivery["exchange"], delivery["routing_key"]]
        try:
            raw = json.dumps(entry)  # the C encoder; the same text for plain JSON values
        except TypeError:  # a value kombu's decoder turned into an object (a datetime, ...)
            raw = _kombu_dumps(entry)
        self._send(
            [
                ("ZADD", self.unacked_index_key, time.time(), delivery_tag),
                ("HSET", self.unacked_key, delivery_tag, raw),
            ]
        )
        _VirtualQoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        # With a key prefix the ledger removed nothing (it writes kombu's default names).
        if _acked_with_result.take(delivery_tag) and not getattr(self.channel, "global_keyprefix", ""):
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
    _crg_client: Any = None
    _crg_batch = False
    """The pop in flight is a batched BLMPOP (``_brpop_start``), not kombu's BRPOP."""

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        # kombu builds a new redis.Redis (registering ~170 response callbacks) twice per message,
        # for the unacked bookkeeping and the ack: a third of the worker's CPU on small calls. A
        # client is a thread-safe facade over the channel's pool, so one serves every caller.
        if client is None:
            if self._crg_client is None:
                self._crg_client = self._create_client()
            client = self._crg_client
        yield client

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> None:
        """kombu's consumer, with every message it holds unacknowledged (a task's: Celery's control
        messages are not acknowledged) either reaching the consumer or released, see ``_crg_take``."""
        super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        if not no_ack:
            self.connection._callbacks[queue] = partial(self._crg_take, callback)

    def _crg_take(self, callback: Any, raw: dict[str, Any]) -> None:
        """Hand a popped message to Celery if it is a task message criogenai could have sent,
        else refuse it. Either way it never holds its slot of the prefetch window: a message
        Celery cannot take (its consumer raises instead of rejecting it) is refused here too."""
        message = self.Message(raw, channel=self)
        self.qos.append(message, message.delivery_tag)
        try:
            why = task_refusal(message)
            if why is None:
                callback(message)
                return
        except self.connection_errors:
            raise  # the consumer reconnects; the message is restored with the unacknowledged
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        log.error("refused a queue entry that is not a criogenai task message (%s); dropped", why)
        if not message.acknowledged:
            message.reject(requeue=False)  # frees its slot and removes its unacknowledged entry

    def _brpop_start(self, timeout: Any = None) -> None:
        """Pop up to as many messages as the prefetch window has room for, in one BLMPOP, where
        kombu sends a BRPOP per message; the same keys, priority order, end of the list and
        server-side timeout."""
        self._crg_batch = False
        if _broken_pops:
            _broken_pops.tell(self.client.connection_pool)
        room = self.qos.can_consume_max_estimate()
        if self.global_keyprefix or room is None or room < 2:
            return super()._brpop_start(timeout)  # type: ignore[no-any-return]
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return None
        keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        self._crg_batch = True
        self.client.connection.send_command(
            "BLMPOP", timeout or 0, len(keys), *keys, "RIGHT", "COUNT", room
        )
        return None

    def _brpop_read(self, **options: Any) -> bool:
        """Read the pop's reply (kombu's BRPOP or the batched BLMPOP) and hand on each entry that is
        a kombu message; kombu decodes and delivers a BRPOP'd entry outside any error handling."""
        try:
            try:
                if self._crg_batch:
                    popped = self.client.connection.read_response()
                else:  # kombu's parser: it strips a global_keyprefix from the key
                    popped = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                _broken_pops.add(list(self.active_queues))  # what Redis popped for it may be gone
                self.client.connection.disconnect()  # the next poll reconnects
                raise
            if not popped:
                raise Empty()
            key, items = popped
            dest = _text(key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            messages = _decoded(items if self._crg_batch else [items])
            if not messages:
                raise Empty()
            if self._crg_batch:
                # Every popped message is kept as unacknowledged before any is handed on, in one
                # round trip; if that fails they go back where they were.
                try:
                    self.qos.keep_unacked(messages)
                except Exception:
                    self._push_back(key, messages)
                    raise
            self._hand_on(messages, dest)
            return True
        finally:
            self._in_poll = None
            self._crg_batch = False
            self._flush_brpop_reauth()

    def _hand_on(self, messages: list[tuple[dict[str, Any], str]], dest: str) -> None:
        """Deliver each popped message. One that kombu cannot take (a body it cannot decode) is
        refused and its entry removed, as a single pop would; on any other failure, the messages
        not yet handed on go back to their queue."""
        done = 0
        try:
            for payload, _ in messages:
                try:
                    self.connection._deliver(payload, dest)
                except self.connection_errors:
                    raise
                except Exception as exc:  # before the consumer saw it (its body's encoding)
                    _refused_entry(exc)
                    self.qos.drop_kept(payload["properties"]["delivery_tag"])
                done += 1
        except BaseException:
            for payload, _ in messages[done:]:
                try:
                    self.qos.restore_by_tag(payload["properties"]["delivery_tag"], leftmost=True)
                except Exception:  # left in the unacked set: restored after the visibility timeout
                    log.warning("could not put a popped message back on its queue", exc_info=True)
            raise
        finally:
            self.qos.forget_kept(messages)

    def _push_back(self, key: bytes, messages: list[tuple[dict[str, Any], str]]) -> None:
        """Return popped messages to the right end of their list, in their order."""
        try:
            with self.conn_or_acquire() as client:
                client.rpush(key, *reversed([text for _, text in messages]))
        except Exception:
            log.error("lost %d popped message(s): they could be neither kept nor put back "
                      "(their calls are sent again by their dispatchers)", len(messages), exc_info=True)


def _refused_entry(exc: Exception) -> None:
    log.error("refused a queue entry that is not a kombu message (%s: %s); dropped",
              type(exc).__name__, str(exc)[:200])


def _decoded(items: list[bytes]) -> list[tuple[dict[str, Any], str]]:
    """The kombu messages among popped queue entries, each with its text; others are refused.
    Any entry is refused alone, whatever its bytes: a kombu type hook may raise anything
    (``{"__type__": "decimal"}``: InvalidOperation), deep nesting RecursionError."""
    out = []
    for item in items:
        try:
            text = _text(item)
            # kombu's decoder turns {"__type__": ...} objects into values in Python, for every
            # object of the envelope; without any, the C decoder gives the same.
            payload = _kombu_loads(text) if '"__type__"' in text else json.loads(text)
            why = _envelope_problem(payload)
            if why is not None:
                raise TypeError(why)
        except Exception as exc:
            _refused_entry(exc)
            continue
        out.append((payload, text))
    return out


def _is(value: Any, *types: type) -> bool:
    """``isinstance``, where a bool is not a number."""
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _envelope_problem(payload: Any) -> str | None:
    """Why a decoded entry is not a kombu envelope that kombu's bookkeeping can hold, or None."""
    if not isinstance(payload, dict):
        return "not an object"
    props = payload.get("properties")
    if not isinstance(props, dict) or not _is(props.get("delivery_tag"), str):
        return "no delivery tag"
    delivery = props.get("delivery_info")
    if not isinstance(delivery, dict) or not all(
        _text_or_none(delivery.get(name)) for name in ("exchange", "routing_key")
    ):
        return "no delivery info"
    if not all(_text_or_none(payload.get(name)) for name in ("body", "content-type", "content-encoding")):
        return "a body, content type or encoding that is not a string"
    if not _text_or_none(props.get("body_encoding")) or not _is(payload.get("headers"), dict, type(None)):
        return "headers that are not an object"
    return None


def _text_or_none(value: Any) -> bool:
    return _is(value, str, type(None))


def _count(value: Any) -> bool:
    return _is(value, int) and value >= 0


def _time_limits(value: Any) -> bool:
    return value is None or (_is(value, list) and len(value) == 2
                             and all(_is(v, int, float, type(None)) for v in value))


def _eta_ok(value: Any) -> bool:
    """An ETA Celery can wait for: a time with its zone (a retry's countdown). One it cannot
    convert makes it file a failure under the message's task id."""
    if value is None:
        return True
    if not _is(value, str):
        return False
    try:
        eta = datetime.fromisoformat(value)
        eta.timestamp()
    except (ValueError, OverflowError, OSError):
        return False
    return eta.tzinfo is not None


def _scalar(value: Any) -> bool:
    return _is(value, str, int, float, bool, type(None))


_HEADERS: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(("lang", "shadow", "root_id", "parent_id", "group", "argsrepr", "kwargsrepr", "origin"),
                    _text_or_none),
    "timelimit": _time_limits,
    "retries": _count,
    "replaced_task_nesting": _count,
    "group_index": lambda v: v is None or _count(v),
    "ignore_result": lambda v: _is(v, bool, type(None)),
    "eta": _eta_ok,
    # Never set by criogenai: with ``expires`` Celery revokes the task's id in this worker (and
    # discards the genuine call of that id), stamps revoke by header.
    **dict.fromkeys(("expires", "stamped_headers", "stamps"), lambda v: not v),
}
"""What Celery's protocol-2 headers may hold; any other header (criogenai's send time, a trace
context) a JSON scalar."""
_EMBED = {"callbacks": list, "errbacks": list, "chain": list, "chord": dict}


def task_refusal(message: Any) -> str | None:
    """Why a message is not a Celery protocol-2 task message criogenai could have sent, or None.

    Checked before Celery's consumer sees it: Celery raises on some wrong types (the message then
    holds its slot), and acts by task id on others (revokes it, or files a failure under it). The
    body is decoded here, once: the message keeps it for Celery (kombu's decode cache).
    """
    headers = message.headers
    if not isinstance(headers, dict):
        return "no headers"
    if not (_is(headers.get("task"), str) and _is(headers.get("id"), str) and headers["id"]):
        return "no task name or id"
    for name, value in headers.items():
        if not _HEADERS.get(name, _scalar)(value):
            return f"header {name[:40]!r} is not one criogenai sends"
    if (message.content_type, message.content_encoding) != ("application/json", "utf-8"):
        return f"disallowed content type {str(message.content_type)[:60]!r} (JSON only)"
    body = _kombu_loads(message.body)
    if not (_is(body, list) and len(body) == 3 and _is(body[0], list) and _is(body[1], dict)
            and _is(body[2], dict, type(None))):
        return "the body is not [args, kwargs, embed]"
    embed = body[2] or {}
    if any(name not in _EMBED or not _is(value, _EMBED[name], type(None)) for name, value in embed.items()):
        return "the body's embed is not Celery's"
    message._decoded_cache = body
    return None


class Transport(_RedisTransport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
