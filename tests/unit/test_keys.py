"""Every Redis key criogenai uses is named in ``_keys.py``: the layout is pinned here (a changed name
strands what a running fleet already wrote), and no other module of the package builds a key."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import criogenai
from criogenai._keys import (
    CELERY_META,
    KOMBU_BINDINGS,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    KOMBU_UNACKED_MUTEX,
    PIDBOX,
    PRIORITY_SEP,
    Keys,
    queue_lists,
)

PACKAGE = Path(criogenai.__file__).parent

LAYOUT = {
    "results": ("app:{r1}:results", "r1"),
    "failed": ("app:{r1}:failed", "r1"),
    "claim": ("app:{r1}:claim:c1", "r1", "c1"),
    "starts": ("app:{r1}:starts", "r1"),
    "stopped": ("app:{r1}:stopped", "r1"),
    "cancel": ("app:{r1}:cancel", "r1"),
    "approvals": ("app:{r1}:approvals", "r1"),
    "run_messages": ("app:{r1}:agent:messages", "r1"),
    "run_state": ("app:{r1}:agent:state", "r1"),
    "approval_runs": ("app:approvals",),
    "reply": ("app:reply:d1", "d1"),
    "workers": ("app:workers:q1", "q1"),
    "cached": ("app:cache:lookup:h1:d1", "lookup", "h1", "d1"),
    "catalog": ("app:catalog:tools",),
    "catalog_tool": ("app:catalog:tool:lookup", "lookup"),
    "limit": ("app:{limits}:tool:lookup:hold", "tool:lookup", "hold"),
    "memories": ("app:mem:{ns:u1}", "ns", "u1"),
    "pattern": ("app:*",),
}


def test_the_key_layout_is_pinned() -> None:
    keys = Keys("app")
    named = {n for n, m in inspect.getmembers(Keys, inspect.isfunction) if not n.startswith("_")}
    assert named == set(LAYOUT), "a key was added or removed: pin its name here"
    for name, (expected, *args) in LAYOUT.items():
        assert getattr(keys, name)(*args) == expected, name
    # A run's keys share one hash tag, so they live in one Redis Cluster slot.
    assert {k.split(":")[1] for k, *args in LAYOUT.values() if "r1" in args} == {"{r1}"}


def test_celery_and_kombu_keys_keep_their_own_names() -> None:
    assert (CELERY_META, KOMBU_UNACKED, KOMBU_UNACKED_INDEX, KOMBU_UNACKED_MUTEX) == (
        "celery-task-meta-", "unacked", "unacked_index", "unacked_mutex")
    assert (KOMBU_BINDINGS, PIDBOX) == ("_kombu.binding", ".celery.pidbox")
    assert queue_lists("q") == ["q", f"q{PRIORITY_SEP}3", f"q{PRIORITY_SEP}6", f"q{PRIORITY_SEP}9"]


FOREIGN = ("celery-task-meta", "unacked", "_kombu.binding", "celery.pidbox", PRIORITY_SEP)
"""Celery's and kombu's key names, which only ``_keys.py`` spells out."""


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own (docstrings), which may name keys."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _key_built(node: ast.AST, docs: set[int]) -> str | None:
    """Why ``node`` builds a Redis key name, or None: an f-string that puts ``:`` after a prefix
    or a hash tag (``{...}``) around a value, or a literal of a Celery or kombu key."""
    if isinstance(node, ast.JoinedStr):
        parts: list[ast.expr | None] = [None, *node.values, None]
        for before, value, after in zip(parts, parts[1:], parts[2:], strict=False):
            if not isinstance(value, ast.FormattedValue):
                continue
            text_after = after.value if isinstance(after, ast.Constant) else ""
            text_before = before.value if isinstance(before, ast.Constant) else ""
            if "prefix" in ast.unparse(value.value) and str(text_after).startswith(":"):
                return f"a key under a prefix: {ast.unparse(node)}"
            if str(text_before).endswith("{") and str(text_after).startswith("}"):
                return f"a hash tag: {ast.unparse(node)}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
        for name in FOREIGN:
            if name in node.value:
                return f"a Celery or kombu key: {node.value!r}"
    return None


def test_no_module_but_keys_builds_a_redis_key() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_keys.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            why = _key_built(node, docs)
            if why:
                found.append(f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', '?')}: {why}")
    assert not found, "name these keys in _keys.py:\n" + "\n".join(found)


def test_the_check_finds_keys_built_elsewhere() -> None:
    samples = [
        'f"{self.prefix}:catalog:tools"',
        'f"{prefix}:reply:{uuid}"',
        'f"x:{{{run_id}}}:agent:state"',
        '"celery-task-meta-" + tid',
        'KEY = "unacked_index"',
        'f"{queue}\\x06\\x16{step}"',
    ]
    for source in samples:
        tree = ast.parse(source)
        assert any(_key_built(n, _docstrings(tree)) for n in ast.walk(tree)), source
    fine = ['"""Celery keeps ``celery-task-meta-<id>``."""', 'f"{self.prefix}_{name}"', 'f"{a}:{b}"']
    for source in fine:
        tree = ast.parse(source)
        assert not any(_key_built(n, _docstrings(tree)) for n in ast.walk(tree)), source
