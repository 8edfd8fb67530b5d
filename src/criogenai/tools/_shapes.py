"""A tool as each model API takes it: OpenAI's function tool and Anthropic's ``input_schema`` tool.

OpenAI's ``strict: true`` (the model's arguments are constrained to the schema) is offered only
for schemas it accepts: every object closed (``additionalProperties: false``) with every property
required, and no keyword outside the subset Structured Outputs supports (so no ``default``: a
parameter with a default is optional, which strict mode cannot express). Schemas made from plain
required parameters of ``str``, ``int``, ``float``, ``bool``, ``Literal`` and ``list`` of those
qualify; optional parameters, ``dict`` parameters and pydantic models that are not closed do not.
"""

from __future__ import annotations

from typing import Any

STRICT_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf",
    "$ref", "$defs", "description", "title", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
})
"""The JSON Schema keywords OpenAI's strict mode takes."""


def openai_strict_ok(schema: dict[str, Any]) -> bool:
    """Whether OpenAI accepts this parameters schema with ``strict: true``."""
    return "anyOf" not in schema and _strict_node(schema)


def _strict_node(node: Any) -> bool:
    if isinstance(node, list):
        return all(_strict_node(n) for n in node)
    if not isinstance(node, dict):
        return True
    if not STRICT_KEYWORDS.issuperset(node):
        return False
    types = node.get("type")
    is_object = types == "object" or (isinstance(types, list) and "object" in types)
    if is_object or "properties" in node:
        if node.get("additionalProperties") is not False:
            return False
        if set(node.get("required", [])) != set(node.get("properties", {})):
            return False
    children = [node.get(k) for k in ("items", "anyOf")]
    children += list(node.get("properties", {}).values()) + list(node.get("$defs", {}).values())
    return all(_strict_node(c) for c in children if c is not None)


def openai_tool(name: str, description: str, parameters: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    """A chat-completions function tool; ``strict`` is sent (true) only where the schema allows it."""
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if strict and openai_strict_ok(parameters):
        function["strict"] = True
    return {"type": "function", "function": function}


def anthropic_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A Messages API tool (the SDK's ``ToolParam``): the schema goes under ``input_schema``."""
    return {"name": name, "description": description, "input_schema": parameters}
