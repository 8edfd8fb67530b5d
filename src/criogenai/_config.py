"""Settings, retry policy and limits: value objects with their defaults in one place.

The environment is read here and nowhere else: every ``CRIOGENAI_<FIELD>`` variable is a field of
``Settings`` (the engine's) or ``WorkerSettings`` (one worker process's), and the rest of criogenai
takes settings passed in or calls ``Settings.from_env()`` / ``WorkerSettings.from_env()``, which
read this process's environment once per distinct ``CRIOGENAI_*`` set and share the result.
Variables that belong to others (a provider's API key, OpenTelemetry's ``OTEL_*``) are read where
they are used.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ._errors import ConfigurationError
from ._wire import DEFAULT_MAX_RESULT_CHARS, DEFAULT_MAX_STORED_CHARS

DEFAULT_TOOL_TIMEOUT_SECS = 60.0
DEFAULT_RETENTION_SECS = 7 * 24 * 3600
DEFAULT_MAX_STORED_RESULT_CHARS = DEFAULT_MAX_STORED_CHARS
DEFAULT_MAX_ARGUMENT_DEPTH = 100
MIN_SIGNING_SECRET_CHARS = 16
ENV_PREFIX = "CRIOGENAI_"
LOOPBACK = "127.0.0.1"


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Retry(_Value):
    """How read-only and idempotent tools are retried after ``ToolError(retryable=True)`` or a timeout.

    The default is the Tools page's: 3 attempts, waiting 0.5 s, then 1 s, with jitter. Other tools
    are never retried, whatever this says.
    """

    max_attempts: int = Field(3, ge=1, le=20)
    initial_backoff: float = Field(0.5, ge=0, le=60)
    max_backoff: float = Field(30.0, ge=0, le=120)
    """Kept well below the broker's visibility timeout: a retry waits in a worker as an ETA message."""
    jitter: float = Field(0.25, ge=0, le=1)
    """Each wait is multiplied by a random factor in [1 - jitter, 1 + jitter]."""


def backoff_secs(
    attempt: int, *, initial: float, maximum: float, jitter: float, rng: random.Random | None = None
) -> float:
    """The wait before run ``attempt + 1`` after run ``attempt`` failed: initial * 2^(attempt-1), jittered."""
    base = min(maximum, initial * 2.0 ** max(0, attempt - 1))
    factor = 1.0 + float((rng or random).uniform(-jitter, jitter))
    return max(0.0, base * factor)


_RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_T = TypeVar("_T", int, str)


def _for_tenant(setting: _T | dict[str, _T] | None, tenant: str | None) -> _T | None:
    """One value for every tenant, or tenant → value with ``"*"`` for the others."""
    if tenant is None or setting is None:
        return None
    if isinstance(setting, dict):
        return setting.get(tenant, setting.get("*"))
    return setting


@functools.lru_cache(maxsize=256)
def parse_rate(text: str) -> tuple[int, float]:
    """``"10/s"`` → (10, 1.0): calls, per window in seconds. Raises ValueError on anything else."""
    count, _, unit = text.strip().partition("/")
    if not count.strip().isdigit() or int(count) < 1 or unit.strip() not in _RATE_UNITS:
        raise ValueError(f"a rate is calls per second, minute or hour, like '10/s' or '100/m'; not {text!r}")
    return int(count), _RATE_UNITS[unit.strip()]


class Limits(_Value):
    """Bounds on a turn. ``limits={"tool_timeout_secs": 20}`` works wherever Limits does."""

    tool_timeout_secs: float = Field(DEFAULT_TOOL_TIMEOUT_SECS, gt=0, le=24 * 3600)
    """Each call's time limit; a tool's own ``timeout_secs`` overrides it."""
    max_result_chars: int = Field(DEFAULT_MAX_RESULT_CHARS, gt=0)
    queue_wait_secs: float = Field(300.0, gt=0)
    """How long a call may wait for a free worker before it ends ``not_started``."""
    no_worker_secs: float = Field(5.0, gt=0)
    """With no live worker on a call's queue, how long to wait for one before giving up."""
    max_calls_per_turn: int = Field(128, ge=1)
    max_argument_bytes: int = Field(256 * 1024, ge=1)
    max_argument_depth: int = Field(DEFAULT_MAX_ARGUMENT_DEPTH, ge=1, le=500)
    """Nesting of objects and arrays in a call's arguments; deeper calls are refused unparsed."""
    max_stored_result_chars: int = Field(DEFAULT_MAX_STORED_RESULT_CHARS, gt=0)
    """What is kept with the run (the full value of a cut result, exception details), in characters."""
    max_model_rounds: int = Field(20, ge=1, le=1000)  # model calls in one agent run
    max_calls_in_flight_per_turn: int = Field(64, ge=1)
    """A turn's calls published and not yet finished, at most; the rest follow in call order."""
    tool_concurrency: dict[str, int] = Field(default_factory=dict)
    """Tool name → calls of it running at once across the whole fleet (with ``@tool(max_concurrency)``,
    the lower wins). Calls over it wait in order, within ``queue_wait_secs``."""
    tenant_concurrency: int | dict[str, int] | None = None
    """Calls of one tenant (``run_turn(..., tenant=...)``) in flight at once across the fleet: one
    number for every tenant, or tenant → number (``"*"``: every other tenant)."""

    tool_rate: dict[str, str] = Field(default_factory=dict)
    """Tool name → how many of its calls may start per second, minute or hour across the fleet
    (``"10/s"``, ``"100/m"``, ``"1000/h"``, as Celery writes rates). Calls over it wait in order."""
    tenant_rate: str | dict[str, str] | None = None
    """The same for one tenant's calls: one rate for every tenant, or tenant → rate (``"*"``: every
    other tenant)."""

    @field_validator("tool_rate", "tenant_rate")
    @classmethod
    def _rates(cls, value: Any) -> Any:
        for text in value.values() if isinstance(value, dict) else [] if value is None else [value]:
            parse_rate(text)
        return value

    def tenant_rate_of(self, tenant: str | None) -> str | None:
        """This tenant's fleet-wide rate of call starts, if any."""
        return _for_tenant(self.tenant_rate, tenant)

    @field_validator("tool_concurrency", "tenant_concurrency")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        numbers = value.values() if isinstance(value, dict) else [] if value is None else [value]
        if any(n < 1 for n in numbers):
            raise ValueError("concurrency limits must be at least 1")
        return value

    def tenant_limit(self, tenant: str | None) -> int | None:
        """The fleet-wide cap of this tenant's calls in flight, if any."""
        return _for_tenant(self.tenant_concurrency, tenant)

    @classmethod
    def coerce(cls, value: Limits | Mapping[str, Any] | None) -> Limits:
        if value is None:
            return cls()
        if isinstance(value, Limits):
            return value
        try:
            return cls(**dict(value))
        except ValidationError as exc:
            raise ConfigurationError(f"invalid limits: {exc}") from exc


class Settings(_Value):
    """Where the fleet is and how it behaves. ``Settings.from_env()`` reads ``CRIOGENAI_*``.

    With no broker URL the engine is embedded: calls run in this process, without Celery.
    """

    # Errors never echo a value back: URLs hold passwords, and the signing secret is a secret.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    broker_url: str | None = None
    """Celery's broker (``redis://...``, ``amqp://...``); None: the embedded engine, no fleet."""
    result_backend: str | None = None
    """Defaults to the broker URL when that is Redis."""
    redis_url: str | None = None
    """Where the ledger (claims, results, workers) lives; defaults to the result backend."""
    key_prefix: str = "crg"
    """The first part of every Redis key criogenai writes (not kombu's queues)."""
    lease_secs: float = Field(10.0, ge=1, le=600)
    """A running call's claim lives this long unless its worker renews it: the redelivery bound."""
    retention_secs: int = Field(DEFAULT_RETENTION_SECS, ge=60)
    """How long finished results are kept under their run."""
    visibility_timeout_secs: int = Field(3600, ge=1)
    """The Redis transport's redelivery backstop; criogenai's lease recovers calls much sooner.
    Keep it above the longest call and its retry waits (the dispatcher refuses tools that would
    exceed it): a message redelivered earlier is only wasted work, never a second run."""
    heartbeat_ttl_secs: float = Field(15.0, ge=1, le=600)
    """A worker is alive while its last heartbeat (every fifth of this) is younger than this:
    dispatchers send again what a dead worker had taken, and the catalog drops its tools. Every
    process of a fleet must agree on it."""
    loop_stall_secs: float = Field(60.0, ge=1, le=3600)
    """On criogenai's threads pool: a worker whose event loop was blocked this long (an async tool
    that blocks, e.g. ``time.sleep`` in ``async def``) exits with status 3, so that its calls run
    elsewhere and its supervisor restarts it, as a prefork child past its hard limit is killed."""
    celery_result_records: bool = False
    """Also keep Celery's own result record (``celery-task-meta-<task id>``) of every call, for
    the retention, so that stock ``AsyncResult(task_id).get()`` reads it: about 750 bytes a call
    more. Off, a call's result is kept once, in its run's results hash, and ``AsyncResult`` of a
    call stays ``PENDING``."""
    signing_secret: str | None = Field(None, repr=False)
    """Shared by dispatchers and workers: calls are signed (HMAC-SHA256) and workers refuse unsigned or
    altered ones. Without it, workers ignore signatures. See ``criogenai._signing``."""
    mcp_token: str | None = Field(None, repr=False)
    """The bearer token HTTP clients of ``criogenai mcp serve`` must send (``--token`` overrides it;
    at least 16 characters, checked by the server)."""

    @field_validator("signing_secret")
    @classmethod
    def _secret_long_enough(cls, value: str | None) -> str | None:
        if value is not None and len(value) < MIN_SIGNING_SECRET_CHARS:
            raise ValueError(f"signing_secret must have at least {MIN_SIGNING_SECRET_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        backend = self.result_backend
        if backend is None and self.broker_url and self.broker_url.startswith(("redis", "rediss")):
            backend = self.broker_url
        redis_url = self.redis_url or backend
        object.__setattr__(self, "result_backend", backend)
        object.__setattr__(self, "redis_url", redis_url)
        if self.broker_url and not redis_url:
            raise ConfigurationError(
                "a Redis URL is needed for results: set CRIOGENAI_RESULT_BACKEND=redis://..."
            )
        return self

    @property
    def embedded(self) -> bool:
        return not self.broker_url

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Each field from ``CRIOGENAI_<FIELD>`` (unset or empty: the default), then ``overrides``
        (None ones ignored). What criogenai uses wherever it is given no settings: from this
        process's environment it is made once per distinct ``CRIOGENAI_*`` set and overrides."""
        key = _key(overrides)
        if environ is None and key is not None:
            return _settings_of(_ours(cls), key)
        return _from_env(cls, "settings", environ, overrides)


WORKER_OPTIONS = (
    "log_format", "metrics_port", "metrics_host", "health_port", "health_host", "otel",
    "max_abandoned_threads",
)
"""The ``WorkerSettings`` that ``criogenai worker`` and ``celery -A criogenai.worker worker`` both take
as options (``--log-format``, ...), each defaulting to its variable: declared once, here."""


def _names(value: Any) -> Any:
    """``"a, b"`` or ``["a,b", "c"]`` → ``("a", "b", "c")``: comma-separated names, as variables hold them."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        return tuple(n.strip() for group in value for n in str(group).split(",") if n.strip())
    return value


class WorkerSettings(_Value):
    """One worker process's own settings: the tools it serves, its queues, and how it is observed.

    Read from ``CRIOGENAI_<FIELD>`` like ``Settings``; the fields in ``WORKER_OPTIONS`` are options
    of both worker commands too, and each field's docstring is its option's help.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    tools: tuple[str, ...] = ()
    """Modules of @tool functions to serve (comma-separated)."""
    queues: tuple[str, ...] = ()
    """The queues to consume (comma-separated); none: every queue of the worker's tools."""
    log_format: Literal["text", "json"] = "text"
    """json: one JSON object per line, with run id, call id, tool, attempt, status and duration."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """Serve Prometheus metrics on this port (needs criogenai[metrics]); 0: none."""
    metrics_host: str = LOOPBACK
    """The address the metrics endpoint binds to (0.0.0.0 in a container)."""
    health_port: int = Field(0, ge=0, le=65535)
    """Serve /livez and /readyz on this port, from the worker's main process; 0: none."""
    health_host: str = LOOPBACK
    """The address the health checks bind to (0.0.0.0 in a container)."""
    otel: bool = False
    """Trace each call with OpenTelemetry (needs criogenai[otel])."""
    max_abandoned_threads: int = Field(0, ge=0, le=100_000)
    """Threads pool: once this many sync tools abandoned past their time limit still run (blocked
    in C: a socket read without a timeout, a lock), stop taking calls, let those in flight finish,
    and exit with status 4 for the supervisor to restart the worker; 0: max(16, 2 * concurrency)."""
    otel_spans_file: str = ""
    """With otel, also append every finished span to this file, one JSON object a line (tests,
    debugging); not an option of the commands."""

    @field_validator("tools", "queues", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _names(value)

    @field_validator("metrics_port", "health_port", mode="before")
    @classmethod
    def _port(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip().isdigit():
            raise ValueError(f"must be a TCP port number, not {value!r}")
        return value

    @field_validator("otel", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        """Any text but "", "0", "false" and "no" turns it on (``CRIOGENAI_OTEL=1``)."""
        if isinstance(value, str):
            return value.strip().lower() not in ("", "0", "false", "no")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Each field from ``CRIOGENAI_<FIELD>`` (unset or empty: the default), then ``overrides``;
        from this process's environment, made once per distinct ``CRIOGENAI_*`` set."""
        key = _key(overrides)
        if environ is None and key is not None:
            return _worker_settings_of(_ours(cls), key)
        return _from_env(cls, "worker settings", environ, overrides)


def env_name(field: str) -> str:
    """The environment variable of a settings field: ``lease_secs`` → ``CRIOGENAI_LEASE_SECS``."""
    return ENV_PREFIX + field.upper()


def option_flag(name: str) -> str:
    """A ``WorkerSettings`` field's command option: ``log_format`` → ``--log-format``."""
    return "--" + name.replace("_", "-")


def option_help(name: str) -> str:
    """A ``WorkerSettings`` field's help as a command option: its docstring, its variable, its default."""
    field = WorkerSettings.model_fields[name]
    default = field.default
    shown = "off" if default is False else ",".join(default) if isinstance(default, tuple) else str(default)
    return f"{field.description} Default: ${env_name(name)}" + (f", else {shown}." if shown else ".")


_S = TypeVar("_S", Settings, WorkerSettings)


def _from_env(cls: type[_S], what: str, environ: Mapping[str, str] | None, overrides: dict[str, Any]) -> _S:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {f: raw for f in cls.model_fields if (raw := env.get(env_name(f)))}
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return cls(**values)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid {what}: {exc}") from exc


_Key = tuple[tuple[str, Any], ...]


def _key(overrides: dict[str, Any]) -> _Key | None:
    """The overrides as a cache key, None when a value cannot be one (then nothing is cached)."""
    key = tuple(sorted((k, v) for k, v in overrides.items() if v is not None))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _ours(cls: type[Settings | WorkerSettings]) -> tuple[tuple[str, str], ...]:
    """The model's variables that are set in this process's environment, as a cache key."""
    get = os.environ.get
    return tuple((name, value) for name in _variables(cls) if (value := get(name)) is not None)


@functools.cache
def _variables(cls: type[Settings | WorkerSettings]) -> tuple[str, ...]:
    return tuple(env_name(f) for f in cls.model_fields)


@functools.lru_cache(maxsize=32)
def _settings_of(environ: tuple[tuple[str, str], ...], overrides: _Key) -> Settings:
    return _from_env(Settings, "settings", dict(environ), dict(overrides))


@functools.lru_cache(maxsize=8)
def _worker_settings_of(environ: tuple[tuple[str, str], ...], overrides: _Key) -> WorkerSettings:
    return _from_env(WorkerSettings, "worker settings", dict(environ), dict(overrides))
