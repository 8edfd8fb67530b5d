"""``criogenai cancel RUN``: cancel a run's turn from anywhere that can reach the fleet's Redis."""

from __future__ import annotations

import argparse
from typing import Any

from ._config import Settings
from ._errors import ConfigurationError


def _cancel(args: argparse.Namespace) -> int:
    from .store import make_ledger

    settings = Settings.from_env()
    if not settings.redis_url:
        raise ConfigurationError(
            "runs are kept in Redis: set CRIOGENAI_BROKER_URL or CRIOGENAI_REDIS_URL=redis://..."
        )
    ledger = make_ledger(settings)
    for run_id in args.runs:
        ledger.cancel(run_id)
        print(f"cancelled run {run_id}: calls not started will not run; running ones are told to stop")
    return 0


def add_cancel_parser(sub: Any) -> None:
    """Add ``cancel`` to the ``criogenai`` parser."""
    c = sub.add_parser("cancel", help="cancel runs: their calls end 'cancelled' within seconds")
    c.add_argument("runs", nargs="+", metavar="RUN", help="run id (as in the results and the logs)")
    c.set_defaults(func=_cancel)
