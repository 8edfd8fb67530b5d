"""Large results by reference: the full text of a call's result, as kept with its run.

The model reads at most ``Limits.max_result_chars`` of a result; the worker files the whole value
(up to ``Limits.max_stored_result_chars``) in the result's artifact under the run, for the run's
retention. This reads it back by (run id, call id), from any process that reaches the fleet's Redis.
"""

from __future__ import annotations

from ._config import Settings
from ._errors import ConfigurationError
from ._signing import authentic
from .store import Ledger


def full_text(ledger: Ledger, run_id: str, call_id: str, *, secret: str | None = None) -> str:
    """The full text of a finished call's result; its ``content`` when the result was not cut.

    Raises LookupError when no result is kept for (run_id, call_id): wrong ids, the retention ran
    out, or the call has not finished; or when the worker that ran it kept no full text; or, with
    a signing ``secret``, when the kept result is not one a worker signed with it.
    """
    found = ledger.finished(run_id, [call_id]).get(call_id)
    if found is None:
        raise LookupError(f"no result is kept for call {call_id!r} of run {run_id!r}")
    if secret is not None and not authentic(found, secret, run_id, call_id):
        raise LookupError(f"the result kept for call {call_id!r} of run {run_id!r} has no valid signature")
    if not found.truncated:
        return found.content
    full = (found.artifact or {}).get("full")
    if not isinstance(full, str):
        raise LookupError(f"call {call_id!r} of run {run_id!r} was cut, and its full text was not kept")
    return full


def fetch_full(run_id: str, call_id: str, *, settings: Settings | None = None) -> str:
    """``full_text`` from the fleet's Redis (``Settings.from_env()`` unless given)."""
    from .store import make_ledger

    settings = settings or Settings.from_env()
    if not settings.redis_url:
        raise ConfigurationError(
            "results are kept in the fleet's Redis: set CRIOGENAI_BROKER_URL=redis://..."
        )
    ledger = make_ledger(settings)
    try:
        return full_text(ledger, run_id, call_id, secret=settings.signing_secret)
    finally:
        ledger.close()
