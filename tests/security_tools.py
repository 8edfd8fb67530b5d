"""Tools for the security tests (tests/integration/test_security.py); served with tests.fleet_tools."""

from __future__ import annotations

import time

from criogenai import ToolError, tool
from tests.fleet_tools import ledger

EXCEPTION_SECRET = "exc-secret-7f3a9c1e5b"
"""What a failing tool's exception says, as a database driver might: it must never leave the worker."""


@tool
def leaky_login(account: str, api_key: str) -> str:
    """Fail as a careless client library does: with a credential in the exception's text."""
    ledger().incr(f"test:runs:leaky:{account}")
    raise RuntimeError(f"login to the ledger failed with password {EXCEPTION_SECRET}")


@tool(read_only=True)
def lookup(order: str) -> str:
    """Refuse unknown orders with a message meant for the model."""
    raise ToolError(f"No order {order}; order ids look like A-123")


@tool
def opaque() -> object:
    """Return a Python object that is not JSON."""
    return object()


@tool
def held(key: str) -> str:
    """Count a run, then wait (up to 60 s) until the test releases the call: a call that is running."""
    ledger().incr(f"test:runs:{key}")
    deadline = time.monotonic() + 60
    while not ledger().exists(f"test:release:{key}") and time.monotonic() < deadline:
        time.sleep(0.02)
    return f"real result {key}"
