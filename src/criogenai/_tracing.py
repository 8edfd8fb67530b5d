"""Optional OpenTelemetry tracing, in the GenAI semantic conventions: an agent run is one trace.

An ``invoke_agent`` span covers the run; under it, a ``chat`` span per model call and a
``criogenai.turn`` span per turn of tool calls; under each turn, every call's Celery task span on
the worker, and in it an ``execute_tool {name}`` span per run of the tool (``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``criogenai.run_id``; status ERROR and ``error.type`` when it failed).

Celery's instrumentation carries the trace context in ``before_task_publish``, which the fast
Redis publisher never sends; so the dispatcher writes the W3C headers (``traceparent``,
``tracestate``) into each call's message itself, and a worker run with ``--otel`` (Celery's
instrumentation, which reads them from the task request) starts each call's span under the turn's.
Without the ``otel`` extra, or with no tracer provider configured, every hook here does nothing.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.metadata import entry_points
from typing import Any, TypeVar, cast

from ._errors import ConfigurationError
from ._version import __version__
from ._wire import ToolCall

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace

    OTEL = True
except ImportError:  # the otel extra is not installed
    OTEL = False

log = logging.getLogger(__name__)

_DEFAULT_SERVICE = "criogenai-worker"

_carriers: dict[str, dict[str, str]] = {}
"""Run id → the W3C headers of its open turn span; read by the publishers on their own threads."""
_turn: ContextVar[list[Any] | None] = ContextVar("criogenai_turn_span", default=None)
"""The open turn span and, once known, its run id."""

F = TypeVar("F", bound=Callable[..., Any])


# -- dispatcher side ------------------------------------------------------------------------------


def inject_trace_headers(headers: dict[str, Any], run_id: str) -> None:
    """Add the trace context of the run's open turn span to a message's headers; else nothing."""
    if _carriers:
        carrier = _carriers.get(run_id)
        if carrier:
            headers.update(carrier)


def trace_headers(run_id: str) -> dict[str, str] | None:
    """The headers ``inject_trace_headers`` adds, for ``send_task(headers=...)``; None when none."""
    return _carriers.get(run_id) if _carriers else None


_provider_set = False


def _tracing_on() -> bool:
    """A tracer provider is set (it cannot be unset): until then a turn costs no span."""
    global _provider_set
    if not _provider_set:
        _provider_set = not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)
    return _provider_set


@contextmanager
def _turn_span() -> Iterator[None]:
    tracer = _trace.get_tracer("criogenai", __version__)
    with tracer.start_as_current_span("criogenai.turn") as span:
        holder: list[Any] = [span]
        token = _turn.set(holder)
        try:
            yield
        finally:
            _turn.reset(token)
            if len(holder) > 1 and _carriers.get(holder[1]) is holder[2]:
                del _carriers[holder[1]]


def traced_turn(method: F) -> F:
    """Run a turn method (sync or async) inside a ``criogenai.turn`` span; as is without OTel."""
    if not OTEL:
        return method
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            if not _tracing_on():
                return await method(*args, **kwargs)
            with _turn_span():
                return await method(*args, **kwargs)

        return cast(F, traced_async)

    @functools.wraps(method)
    def traced(*args: Any, **kwargs: Any) -> Any:
        if not _tracing_on():
            return method(*args, **kwargs)
        with _turn_span():
            return method(*args, **kwargs)

    return cast(F, traced)


def note_turn(run_id: str, calls: Sequence[ToolCall], known: Container[str]) -> None:
    """Describe the open turn span; from now on the run's messages carry its trace context.

    ``criogenai.tools`` lists only ``known`` names (the registry's): a name the model made up may be
    any size, and a span carrying megabytes of it would be refused by its exporter."""
    holder = _turn.get()
    if holder is None or len(holder) > 1:
        return
    span = holder[0]
    span.set_attributes(
        {
            "criogenai.run_id": run_id,
            "criogenai.call_count": len(calls),
            "criogenai.tools": sorted({c.name for c in calls if c.name in known}),
        }
    )
    if span.get_span_context().is_valid:  # with no tracer provider there is nothing to carry
        carrier: dict[str, str] = {}
        _propagate.inject(carrier, context=_trace.set_span_in_context(span))
        holder += [run_id, carrier]
        _carriers[run_id] = carrier


# -- the agent: GenAI spans -----------------------------------------------------------------------

OK_STATUSES = frozenset({"ok", "pending_approval"})
"""Call statuses that are not a failure of the tool's run."""


class _NoSpan:
    """What the span helpers give when tracing is off: takes every record and keeps nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        pass


_NO_SPAN = _NoSpan()


def _span_on() -> bool:
    return OTEL and _tracing_on()


@contextmanager
def genai_span(
    operation: str, name: str, attributes: dict[str, Any], *, client: bool = False
) -> Iterator[Any]:
    """A span named ``"{operation} {name}"`` with ``gen_ai.operation.name``, made current; an
    exception ends it with status ERROR and ``error.type``. Yields a no-op span when tracing is off."""
    if not _span_on():
        yield _NO_SPAN
        return
    tracer = _trace.get_tracer("criogenai", __version__)
    kind = _trace.SpanKind.CLIENT if client else _trace.SpanKind.INTERNAL
    attributes = {"gen_ai.operation.name": operation, **attributes}
    title = f"{operation} {name}".strip()
    with tracer.start_as_current_span(title, kind=kind, attributes=attributes) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            raise


def tool_span(name: str, call_id: str, run_id: str, attempt: int) -> Any:
    """A worker's ``execute_tool`` span for one run of a call; end it with ``end_tool_span``."""
    return genai_span("execute_tool", name, {
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
        "criogenai.run_id": run_id,
        "criogenai.attempt": attempt,
    })


def end_tool_span(span: Any, status: str, artifact: dict[str, Any] | None) -> None:
    """Record how a run of a tool ended: its status, and for a failure, ERROR with ``error.type``
    (the exception's type for an unexpected exception, else the status)."""
    if span is _NO_SPAN:
        return
    span.set_attribute("criogenai.status", status)
    if status in OK_STATUSES:
        return
    error_type = status
    if status == "exception":
        error_type = str(((artifact or {}).get("exception") or {}).get("type") or status)
    span.set_attribute("error.type", error_type)
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, status))


# -- worker side ----------------------------------------------------------------------------------

_worker_provider: Any = None


def _exporter_classes() -> list[Any]:
    """The span exporters that ``OTEL_TRACES_EXPORTER`` names (default ``otlp``; ``none``: none)."""
    group = "opentelemetry_traces_exporter"
    classes = []
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
        name = name.strip()
        if name in ("", "none"):
            continue
        candidates = [name, "otlp_proto_http", "otlp_proto_grpc"] if name == "otlp" else [name]
        found = [ep for c in candidates for ep in entry_points(group=group, name=c)]
        if found:
            classes.append(found[0].load())
        elif name == "otlp":
            log.warning("no OTLP span exporter installed (opentelemetry-exporter-otlp): spans go to stdout")
            classes.append(next(iter(entry_points(group=group, name="console"))).load())
        else:
            raise ConfigurationError(f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed")
    return classes


def _json_lines_exporter(path: str) -> Any:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open while the process lives
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")


def _start_process_tracing(exporters: list[Any], spans_file: str) -> None:
    """In a process that runs tasks: a tracer provider (unless one is set) and Celery's instrumentation."""
    global _worker_provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": _DEFAULT_SERVICE}))
        _worker_provider = TracerProvider(resource=resource)
        for exporter in exporters:
            _worker_provider.add_span_processor(BatchSpanProcessor(exporter()))
        if spans_file:  # written as each span ends, for tests and debugging
            _worker_provider.add_span_processor(SimpleSpanProcessor(_json_lines_exporter(spans_file)))
        _trace.set_tracer_provider(_worker_provider)
    instrumentor: Any = importlib.import_module("opentelemetry.instrumentation.celery").CeleryInstrumentor()
    instrumentor.instrument()


def _stop_process_tracing(**_: Any) -> None:
    """Send the spans still batched before a pool process exits (it skips ``atexit``)."""
    if _worker_provider is not None:
        _worker_provider.shutdown()


def instrument_worker(pool: str, spans_file: str = "") -> None:
    """``criogenai worker --otel``: trace tasks in every process that runs them (and, with
    ``spans_file``, append each finished span to it as a JSON line).

    Under prefork that is each pool child, set up in ``worker_process_init`` (a tracer provider's
    export thread does not survive a fork); under threads, this process.
    """
    try:
        importlib.import_module("opentelemetry.instrumentation.celery")
        importlib.import_module("opentelemetry.sdk.trace")
    except ImportError:
        raise ConfigurationError("--otel needs the otel extra: pip install 'criogenai[otel]'") from None
    from celery import signals

    exporters = _exporter_classes()  # a wrong name fails here, not in every child
    if pool == "prefork":
        signals.worker_process_init.connect(
            lambda **_: _start_process_tracing(exporters, spans_file), weak=False
        )
        signals.worker_process_shutdown.connect(_stop_process_tracing, weak=False)
    else:
        _start_process_tracing(exporters, spans_file)
