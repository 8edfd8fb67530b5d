"""What ``import criogenai`` loads: none of the fleet's machinery, no broker or HTTP client, no
JSON Schema validator; an embedded turn loads no Celery either; and every public name resolves."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import criogenai
from tests.conftest import PYTHONPATH

FLEET = ["celery", "kombu", "billiard"]
NOT_ON_IMPORT = [*FLEET, "redis", "httpx", "jsonschema", "mcp"]
"""Packages ``import criogenai`` must not load: each is imported by the feature that uses it."""
NOT_IN_EMBEDDED_TURN = [*FLEET, "redis", "httpx", "mcp"]
"""Packages an embedded turn of a plain @tool, no broker configured, must not load."""

EMBEDDED_TURN = """
import json, sys

def loaded():
    return sorted({m.split(".")[0] for m in sys.modules})

import criogenai
after_import = loaded()
from criogenai import Dispatcher, ToolCall, tool

@tool
def add(a: int, b: int) -> int:
    "Add two numbers."
    return a + b

d = Dispatcher([add])
try:
    [result] = d.run_turn_sync([ToolCall(id="c1", name="add", arguments={"a": 2, "b": 3})])
finally:
    d.close()
print(json.dumps({"status": result.status, "content": result.content,
                  "after_import": after_import, "after_turn": loaded()}))
"""

EVERY_NAME = """
import json
import criogenai
resolved = {name: type(getattr(criogenai, name)).__name__ for name in criogenai.__all__}
star = {}
exec("from criogenai import *", star)
print(json.dumps({"resolved": resolved, "star": sorted(set(star) - {"__builtins__"}),
                  "dir": sorted(set(criogenai.__all__) - set(dir(criogenai)))}))
"""


def fresh_interpreter(code: str) -> Any:
    """Run ``code`` in a new interpreter with no CRIOGENAI_* setting (so no broker); its last line's JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRIOGENAI_")}
    env["PYTHONPATH"] = PYTHONPATH
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def embedded_turn() -> Any:
    return fresh_interpreter(EMBEDDED_TURN)


def test_import_and_an_embedded_turn_load_no_celery_module(embedded_turn: Any) -> None:
    assert (embedded_turn["status"], embedded_turn["content"]) == ("ok", "5")
    assert set(FLEET) & set(embedded_turn["after_import"]) == set()
    assert set(NOT_IN_EMBEDDED_TURN) & set(embedded_turn["after_turn"]) == set()


def test_import_criogenai_loads_no_broker_client_http_client_or_schema_validator(embedded_turn: Any) -> None:
    assert "criogenai" in embedded_turn["after_import"]
    assert set(NOT_ON_IMPORT) & set(embedded_turn["after_import"]) == set()


def test_every_public_name_resolves_on_first_use() -> None:
    seen = fresh_interpreter(EVERY_NAME)
    assert sorted(seen["resolved"]) == sorted(criogenai.__all__)
    assert seen["star"] == sorted(criogenai.__all__)
    assert seen["dir"] == []


def test_type_checkers_see_every_public_name() -> None:
    """Each name in ``__all__`` is imported in ``criogenai/__init__.py``, at run time or under
    ``TYPE_CHECKING``, so that mypy and IDEs know it although it is loaded on first use."""
    tree = ast.parse(Path(criogenai.__file__).read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names
    }
    assert imported == set(criogenai.__all__)
