"""``criogenai approvals list|approve|reject``: the person on call decides pending approvals."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ._config import Settings
from ._errors import ConfigurationError


def _approvals() -> Any:
    from .dispatcher import Approvals

    settings = Settings.from_env()
    if not settings.redis_url:
        raise ConfigurationError(
            "approvals are kept in Redis: set CRIOGENAI_BROKER_URL or CRIOGENAI_REDIS_URL=redis://..."
        )
    return Approvals(settings)


def shown(text: str) -> str:
    """``text`` for a terminal: every non-printable character as its escape (``\\x1b``, ``\\n``), so
    an id, a tool name or a name from the store cannot forge a line or send escape sequences."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _list(args: argparse.Namespace) -> int:
    records = _approvals().records(args.run, decided=args.all)
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
        return 0
    if not records:
        print("no calls wait for approval" if not args.all else "no approvals")
        return 0
    for r in records:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.requested_at))
        state = "" if r.decision == "pending" else f"  [{r.decision}{' by ' + shown(r.by) if r.by else ''}]"
        row = (shown(r.run_id), shown(r.call_id), shown(r.tool_name), when, json.dumps(r.call.arguments))
        print("  ".join(row) + state)  # json.dumps escapes the arguments' own control characters
    return 0


def _decide(args: argparse.Namespace) -> int:
    from .dispatcher import ApprovalConflict, ApprovalNotFound, InvalidApprovalArguments

    approvals = _approvals()
    try:
        if args.command_approvals == "approve":
            arguments = None
            if args.arguments is not None:
                try:
                    arguments = json.loads(args.arguments)
                except json.JSONDecodeError as exc:
                    raise ConfigurationError(f"--arguments is not JSON: {exc}") from exc
            record = approvals.approve(args.run, args.call, arguments, by=args.by)
            how = " with edited arguments" if record.arguments is not None else ""
            print(f"approved call {args.call} of run {args.run}{how}")
        else:
            approvals.reject(args.run, args.call, args.reason, by=args.by)
            print(f"rejected call {args.call} of run {args.run}")
    except InvalidApprovalArguments as exc:
        print("criogenai: the edited arguments were refused; nothing changed:", file=sys.stderr)
        for p in exc.problems:
            print(f"- {p}", file=sys.stderr)
        return 1
    except (ApprovalConflict, ApprovalNotFound, ValueError) as exc:
        print(f"criogenai: {exc}", file=sys.stderr)
        return 1
    return 0


def add_approvals_parser(sub: Any) -> None:
    """Add ``approvals`` and its three subcommands to the ``criogenai`` parser."""
    a = sub.add_parser("approvals", help="list and decide tool calls that wait for a person")
    asub = a.add_subparsers(dest="command_approvals", required=True)
    ls = asub.add_parser("list", help="the calls that wait for a person")
    ls.add_argument("--run", default=None, help="only this run")
    ls.add_argument("--all", action="store_true", help="include calls already decided")
    ls.add_argument("--json", action="store_true", help="full records as JSON")
    ls.set_defaults(func=_list)
    ap = asub.add_parser("approve", help="let a call run, as asked or with edited arguments")
    ap.add_argument("run")
    ap.add_argument("call")
    ap.add_argument("--arguments", default=None, metavar="JSON", help="run with these arguments instead")
    ap.add_argument("--by", default="", metavar="NAME")
    ap.set_defaults(func=_decide)
    rj = asub.add_parser("reject", help="refuse a call; the model is told the reason")
    rj.add_argument("run")
    rj.add_argument("call")
    rj.add_argument("--reason", required=True, metavar="TEXT")
    rj.add_argument("--by", default="", metavar="NAME")
    rj.set_defaults(func=_decide)
