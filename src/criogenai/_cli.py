"""The ``criogenai`` command: ``worker`` runs a Celery worker for tool modules; ``demo`` runs a turn."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, Literal, get_args, get_origin

from kombu.utils.url import maybe_sanitize_url

from ._cli_approvals import add_approvals_parser
from ._cli_cancel import add_cancel_parser
from ._cli_fleet import add_fleet_parsers, catalog_registry
from ._cli_mcp import add_mcp_parser
from ._config import WORKER_OPTIONS, Settings, WorkerSettings, env_name, option_flag, option_help
from ._errors import ConfigurationError, StoreError

POOLS = ("prefork", "threads")


def _worker(args: argparse.Namespace, celery_args: list[str]) -> int:
    """Build the app for the tool modules, then hand every other argument to Celery's worker; the
    criogenai options go to the same command, whose ``celeryd_init`` applies them (``_options``)."""
    from .tools import ToolRegistry
    from .worker import create_app
    from .worker._credentials import exit_status

    settings = Settings.from_env()
    if settings.embedded:
        raise ConfigurationError("a worker needs a broker: set CRIOGENAI_BROKER_URL=redis://...")
    modules = list(WorkerSettings.from_env(tools=args.tools).tools)
    if not modules:
        raise ConfigurationError("name the tool modules: --tools MODULE, or CRIOGENAI_TOOLS=MODULE,...")
    registry = ToolRegistry.from_modules(modules)
    for server in registry.servers:  # listed; each pool process opens its own session when called
        server.close()
    os.environ[env_name("tools")] = ",".join(modules)  # for the processes Celery starts
    app = create_app(settings, registry)
    pool = [f"--pool={args.pool}"]
    if args.pool == "threads":  # criogenai's pool: calls wait on one event loop, not a thread each
        from .worker._pool import POOL

        app.conf.worker_pool = POOL
        pool = []  # Celery maps its default pool name to worker_pool; "threads" to its own
    argv = ["worker", *pool, f"--loglevel={args.loglevel}", "--without-gossip", "--without-mingle"]
    argv += _given_worker_options(args)
    if args.queues:
        argv.append(f"--queues={args.queues}")
    if args.concurrency:
        argv.append(f"--concurrency={args.concurrency}")
    if args.hostname:
        argv.append(f"--hostname={args.hostname}")
    if args.events:
        argv.append("--task-events")
    status = _run_celery(app, [*argv, *celery_args])
    return exit_status() or status  # refused credentials: Celery's own status does not say so


def _add_worker_options(parser: argparse.ArgumentParser) -> None:
    """criogenai's worker options, made from ``WorkerSettings`` as Celery's are (``worker/_options``).
    Only those given are handed on: Celery's side reads the others' defaults from the environment."""
    group = parser.add_argument_group("criogenai's options (also of `celery -A criogenai.worker worker`)")
    for name in WORKER_OPTIONS:
        field = WorkerSettings.model_fields[name]
        flag = option_flag(name)
        options: dict[str, Any] = {"default": argparse.SUPPRESS, "help": option_help(name)}
        if field.annotation is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif get_origin(field.annotation) is Literal:
            options["choices"] = get_args(field.annotation)
        else:
            options["type"] = field.annotation
        group.add_argument(flag, **options)


def _given_worker_options(args: argparse.Namespace) -> list[str]:
    """The criogenai options given to ``criogenai worker``, as Celery's worker command takes them."""
    given = []
    for name in (n for n in WORKER_OPTIONS if hasattr(args, n)):
        value, flag = getattr(args, name), option_flag(name)
        if isinstance(value, bool):
            given.append(flag if value else f"--no-{flag[2:]}")
        else:
            given.append(f"{flag}={value}")
    return given


def _run_celery(app: Any, argv: list[str]) -> int:
    """Run Celery's command line for ``app``; its exit status, non-zero after an unrecoverable
    error, so that a supervisor's restart-on-failure applies. ``app.worker_main`` and
    ``app.start`` drop it (click returns it, they return None): such a worker exited 0."""
    from celery.bin.celery import celery

    celery.params[0].default = app  # as ``app.start`` does
    try:
        return int(celery.main(args=argv, standalone_mode=False) or 0)
    finally:
        celery.params[0].default = None


def _demo(args: argparse.Namespace) -> int:
    from ._wire import ToolCall
    from .dispatcher import Dispatcher
    from .tools import ToolRegistry

    if args.from_catalog:  # an agent process without the tools' code
        registry = catalog_registry(["get_lab_result", "schedule_visit", "send_message"], args.wait)
    else:
        registry = ToolRegistry.from_modules([args.tools])
    calls = [
        ToolCall(id="call_1", name="get_lab_result", arguments={"test_id": "LAB-12345"}),
        ToolCall(id="call_2", name="get_lab_result", arguments={"test_id": "12345"}),
        ToolCall(
            id="call_3",
            name="schedule_visit",
            arguments={"patient_ref": "P-1", "kind": "home", "slots": ["2026-12-03T09:00"]},
        ),
        ToolCall(
            id="call_4",
            name="schedule_visit",
            arguments={"patient_ref": "P-1", "kind": "spa", "slots": [], "colour": "red"},
        ),
        ToolCall(id="call_5", name="send_message", arguments={"text": "Visit booked for P-1."}),
        ToolCall(id="call_6", name="refund_order", arguments={"order": "A-1"}),
    ]
    with Dispatcher(registry) as dispatcher:
        where = (
            "embedded engine"
            if dispatcher.settings.embedded
            else maybe_sanitize_url(dispatcher.settings.broker_url)  # never print a password
        )
        print(f"Running a turn of {len(calls)} calls on the {where}:\n")
        for call, result in zip(calls, dispatcher.run_turn_sync(calls), strict=True):
            print(f"{call.id} {call.name}({json.dumps(call.arguments)})")
            print(f"  -> {result.status}: {result.content}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # tool modules named relative to where the command runs
    parser = argparse.ArgumentParser(prog="criogenai", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser(
        "worker",
        help="run a Celery worker that serves tool modules",
        description="Run a Celery worker that serves tool modules. Every other option is Celery's "
        "worker's (--autoscale, --max-tasks-per-child, --max-memory-per-child, --prefetch-multiplier, "
        "-O fair, --pidfile, --logfile, ...: see `celery worker --help`).",
        allow_abbrev=False,  # a prefix of a Celery option must reach Celery, not match one of ours
    )
    w.add_argument("--tools", action="append", metavar="MODULE", help=option_help("tools") + " Repeatable.")
    w.add_argument("--concurrency", "-c", type=int, default=0)
    w.add_argument(
        "--pool",
        "-P",
        choices=POOLS,
        default="prefork",
        help="prefork: a process per slot, hard time limits; threads: many calls per process "
        "(async tools on one event loop, sync tools on threads; a stuck sync tool is abandoned, not killed)",
    )
    w.add_argument("--queues", "-Q", default="", help=option_help("queues"))
    w.add_argument("--loglevel", "-l", default="INFO")
    w.add_argument("--hostname", "-n", default="")
    w.add_argument("--events", "-E", action="store_true", help="send task events (for Flower)")
    _add_worker_options(w)
    w.set_defaults(func=_worker)
    d = sub.add_parser("demo", help="run a turn of the clinic tools (embedded without a broker)")
    d.add_argument("--tools", default="criogenai.demo")
    d.add_argument("--from-catalog", action="store_true", help="tool schemas from live workers")
    d.add_argument("--wait", type=float, default=60.0, help="seconds to wait for workers")
    d.set_defaults(func=_demo)
    add_approvals_parser(sub)
    add_fleet_parsers(sub)
    add_cancel_parser(sub)
    add_mcp_parser(sub)
    args, rest = parser.parse_known_args(argv)
    if rest and args.func is not _worker:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.func is _worker:
            return int(_worker(args, rest))
        return int(args.func(args))
    except ConfigurationError as exc:
        print(f"criogenai: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:  # Redis away or refusing: one line, not a traceback
        print(f"criogenai: {exc}", file=sys.stderr)
        return 1
