"""Embedded use loads none of the fleet's machinery: no Celery, kombu or billiard module."""

from __future__ import annotations

import json
import os
import subprocess
import sys

FLEET = ("celery", "kombu", "billiard")

EMBEDDED_TURN = """
import json, sys
import criogenai
after_import = sorted(m for m in sys.modules if m.split(".")[0] in {fleet!r})
from criogenai import Dispatcher, ToolCall, tool

@tool
def add(a: int, b: int) -> int:
    "Add two numbers."
    return a + b

d = Dispatcher([add])
try:
    [result] = d.run_turn_sync([ToolCall(id="c1", name="add", arguments={{"a": 2, "b": 3}})])
finally:
    d.close()
after_turn = sorted(m for m in sys.modules if m.split(".")[0] in {fleet!r})
print(json.dumps({{"status": result.status, "content": result.content,
                  "after_import": after_import, "after_turn": after_turn}}))
"""


def test_import_and_an_embedded_turn_load_no_celery_module() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRIOGENAI_")}
    out = subprocess.run(
        [sys.executable, "-c", EMBEDDED_TURN.format(fleet=FLEET)],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert (seen["status"], seen["content"]) == ("ok", "5")
    assert seen["after_import"] == []
    assert seen["after_turn"] == []


def test_import_and_an_embedded_turn_load_no_redis_module() -> None:
    """redis-py is loaded only when a Redis store is made: the embedded engine never needs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRIOGENAI_")}
    out = subprocess.run(
        [sys.executable, "-c", EMBEDDED_TURN.format(fleet=("redis",))],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert (seen["status"], seen["after_import"], seen["after_turn"]) == ("ok", [], [])
