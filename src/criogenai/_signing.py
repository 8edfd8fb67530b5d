"""Message authenticity: a dispatcher signs each call with a shared secret; workers check it.
Workers sign each result with the same secret; dispatchers check it.

A call's signature is an HMAC-SHA256 over a canonical JSON of what decides what runs and how: the
tool's name, the call and run ids, the arguments, the deadline, where the result goes and every
policy field of the task. A result's signature covers every field of the result (run and call ids,
tool, status, content, artifact, counts), under its own label (``RESULT_SCHEME``), so that a call's
signature never passes for a result's. Someone who can write to Redis but does not know the secret
can then neither forge or edit a call in the queue nor forge or edit a result a dispatcher reads.
Nothing is encrypted: arguments and results stay readable.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from ._wire import ToolResult, ToolTask

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
    if task.scope is not None:
        # Only when set, so that a call without a scope signs exactly as before (rolling upgrades).
        signed["scope"] = task.scope
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


RESULT_SCHEME = "hmac-sha256-result-v1"
"""Prefix of a result's signature, and the label its signed bytes start with: a call's signed bytes
start with ``{``, so no call signature can be a result signature (domain separation)."""

_SIGNED_RESULT_FIELDS = (
    "v",
    "run_id",
    "call_id",
    "name",
    "status",
    "content",
    "artifact",
    "attempts",
    "truncated",
    "duration_secs",
    "cached",
)
"""Every field but the signature, named one by one for the reason given for the call's."""


def canonical_result(result: ToolResult) -> bytes:
    """The bytes a result's signature covers: the label, then a canonical JSON of its fields.

    Built from the result as JSON text, read back (what the dispatcher reads), sorted keys, ASCII
    only.
    """
    body = json.loads(result.model_dump_json())
    signed = {name: body.get(name) for name in _SIGNED_RESULT_FIELDS}
    text = json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"{RESULT_SCHEME}\n{text}".encode("ascii")


def result_signature_of(result: ToolResult, secret: str) -> str:
    """The signature of ``result`` under ``secret`` (its own ``signature`` field is not signed)."""
    digest = hmac.new(secret.encode(), canonical_result(result), hashlib.sha256).hexdigest()
    return f"{RESULT_SCHEME}:{digest}"


def sign_result(result: ToolResult, secret: str) -> ToolResult:
    """A copy of ``result`` carrying its signature: how a worker with a secret files every result."""
    return result.model_copy(update={"signature": result_signature_of(result, secret)})


def authentic(result: ToolResult, secret: str, run_id: str, call_id: str) -> bool:
    """Whether ``result`` was signed with ``secret`` by a worker, for call ``call_id`` of ``run_id``.

    The ids are where the reader found or expects it: a genuine result of another call, copied
    under this one's ids, does not pass.
    """
    if not result.signature or (result.run_id, result.call_id) != (run_id, call_id):
        return False
    expected = result_signature_of(result, secret)
    return hmac.compare_digest(expected.encode(), result.signature.encode("utf-8", "replace"))


def key_id(secret: str | None) -> str | None:
    """A short public name of ``secret`` (None for none), which workers publish in the catalog so that
    a dispatcher with no secret or another one can tell at once instead of waiting for calls to time
    out. It reveals nothing of the secret (an HMAC of a fixed label)."""
    if secret is None:
        return None
    return hmac.new(secret.encode(), b"criogenai key id\n", hashlib.sha256).hexdigest()[:16]
