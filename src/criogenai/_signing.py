"""Message authenticity: a dispatcher signs each call with a shared secret; workers check it.

The signature is an HMAC-SHA256 over a canonical JSON of what decides what runs and how: the
tool's name, the call and run ids, the arguments, the deadline, where the result goes and every
policy field of the task. Someone who can write to Redis but does not know the secret can then
neither forge a call nor edit one in the queue. Nothing is encrypted: arguments stay readable.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from ._wire import ToolTask

SCHEME = "hmac-sha256-v1"
"""Prefix of every signature, so that a later scheme can be told apart from this one."""

_SIGNED_TASK_FIELDS = (
    "v",
    "run_id",
    "deadline",
    "reply_to",
    "timeout_secs",
    "max_attempts",
    "on_tool_exception",
    "initial_backoff_secs",
    "max_backoff_secs",
    "jitter",
    "max_result_chars",
    "max_stored_chars",
)
"""Named one by one (not "every field"), so that adding a field to ToolTask never changes what an
older worker computes for the same call during a rolling upgrade."""


def canonical(task: ToolTask) -> bytes:
    """The bytes that are signed: the same on both sides for the same call, whatever the key order.

    Built from the JSON form of the task (what crosses the wire), sorted keys, ASCII only.
    Raises ValueError when the arguments cannot be made JSON (too deep, not finite numbers).
    """
    body = task.model_dump(mode="json")
    signed: dict[str, Any] = {name: body.get(name) for name in _SIGNED_TASK_FIELDS}
    signed["scheme"] = SCHEME
    signed["call_id"] = body["call"]["id"]
    signed["tool"] = body["call"]["name"]
    signed["arguments"] = body["call"]["arguments"]
    try:
        text = json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"the call cannot be signed: {type(exc).__name__}") from None
    return text.encode("ascii")


def signature_of(task: ToolTask, secret: str) -> str:
    """The signature of ``task`` under ``secret`` (its own ``signature`` field is not signed)."""
    digest = hmac.new(secret.encode(), canonical(task), hashlib.sha256).hexdigest()
    return f"{SCHEME}:{digest}"


def sign(task: ToolTask, secret: str) -> ToolTask:
    """A copy of ``task`` carrying its signature."""
    return task.model_copy(update={"signature": signature_of(task, secret)})


def refusal(task: ToolTask, secret: str | None) -> str | None:
    """Why a worker with ``secret`` must refuse ``task``, or None when it may run it.

    A worker without a secret ignores signatures (None). With one, an unsigned call, a call signed
    under another secret or scheme, and a call changed after it was signed are refused.
    """
    if secret is None:
        return None
    if not task.signature:
        return "the call is not signed, and this worker only runs signed calls"
    try:
        expected = signature_of(task, secret)
    except ValueError as exc:
        return str(exc)
    if not hmac.compare_digest(expected.encode(), task.signature.encode("utf-8", "replace")):
        return "the call's signature does not match: it was altered, or signed with another secret"
    return None
