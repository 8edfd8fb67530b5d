"""The definition side of the Tools page: type hints to JSON Schema, names, descriptions, flags.

Tools are defined at module level where a hint names a module-level class, so that the hints
resolve the way they do in user code.
"""

import asyncio
import datetime
import json
from typing import Annotated, Any, Dict, List, Literal, Optional, Set, Tuple, Union  # noqa: UP035

import jsonschema
import pytest
from examples.clinic import Address, get_lab_result, schedule_visit, send
from pydantic import BaseModel, Field

from criogenai import Tool, ToolContext, ToolDefinitionError, tool, tool_from_schema
from criogenai.tools import InvalidArguments, ToolDefinition, ValidArguments

ARGS = {"patient_ref": "P-1", "kind": "home", "slots": ["2025-01-01T09:00"]}


def assert_valid_schema(t: Tool[..., Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(t.schema)


def only_property(t: Tool[..., Any]) -> dict[str, Any]:
    (prop,) = t.schema["properties"].values()
    return prop


# -- the Tools page's schedule_visit, hint by hint ---------------------------------------------


def test_schedule_visit_schema_is_the_one_the_page_describes() -> None:
    schema = schedule_visit.schema

    assert schema["type"] == "object"
    assert schema["properties"] == {
        "patient_ref": {"type": "string"},
        "kind": {"enum": ["home", "clinic", "video"], "type": "string"},
        "slots": {"type": "array", "items": {"type": "string"}},
        "duration_minutes": {"type": "integer", "default": 30},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "address": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": None},
    }
    assert schema["required"] == ["patient_ref", "kind", "slots"]
    assert schema["additionalProperties"] is False
    assert_valid_schema(schedule_visit)


def test_schedule_visit_address_is_the_pydantic_models_own_schema() -> None:
    address = schedule_visit.schema["$defs"]["Address"]

    assert address["type"] == "object"
    assert address["properties"] == {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "postcode": {"type": "string"},
    }
    assert address["required"] == ["street", "city", "postcode"]


def test_printing_the_schema_shows_the_json_the_model_sees(capsys: pytest.CaptureFixture[str]) -> None:
    print(schedule_visit.schema)

    out = capsys.readouterr().out
    assert "'patient_ref': {'type': 'string'}" in out
    assert "'additionalProperties': False" in out


def test_schedule_visit_schema_is_plain_json() -> None:
    assert json.loads(json.dumps(schedule_visit.schema)) == schedule_visit.schema


def test_schedule_visit_receives_an_address_instance_and_its_defaults() -> None:
    checked = schedule_visit.validate(
        {**ARGS, "address": {"street": "1 Main St", "city": "Lyon", "postcode": "69001"}}
    )

    assert isinstance(checked, ValidArguments)
    assert checked.kwargs["address"] == Address(street="1 Main St", city="Lyon", postcode="69001")
    assert checked.kwargs["duration_minutes"] == 30
    assert checked.kwargs["note"] is None
    result = schedule_visit.invoke(checked.kwargs, ToolContext(call_id="c1", run_id="r1"))
    assert result == {"booked": "2025-01-01T09:00", "kind": "home", "minutes": 30}


# -- the table of hints, row by row ------------------------------------------------------------


@tool
def scalars(s: str, i: int, f: float, b: bool) -> None:
    """Scalars."""


def test_scalar_hints_become_string_integer_number_boolean() -> None:
    assert scalars.schema["properties"] == {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "f": {"type": "number"},
        "b": {"type": "boolean"},
    }
    assert scalars.schema["required"] == ["s", "i", "f", "b"]
    assert_valid_schema(scalars)


@tool
def literal(kind: Literal["a", "b"]) -> None:
    """Literal."""


def test_literal_hint_becomes_enum() -> None:
    assert only_property(literal)["enum"] == ["a", "b"]
    assert isinstance(literal.validate({"kind": "c"}), InvalidArguments)
    assert isinstance(literal.validate({"kind": "a"}), ValidArguments)


@tool
def one_literal(kind: Literal["home"], n: Literal[3] = 3) -> None:
    """Literal of one value."""


def test_a_one_value_literal_is_a_one_item_enum_not_const() -> None:
    assert one_literal.schema["properties"]["kind"] == {"enum": ["home"], "type": "string"}
    assert one_literal.schema["properties"]["n"]["enum"] == [3]
    assert "const" not in json.dumps(one_literal.schema)
    assert isinstance(one_literal.validate({"kind": "away"}), InvalidArguments)
    assert isinstance(one_literal.validate({"kind": "home"}), ValidArguments)


@tool
def typing_list(xs: List[str]) -> None:  # noqa: UP006
    """typing.List."""


@tool
def builtin_list(xs: list[str]) -> None:
    """list."""


@pytest.mark.parametrize("t", [typing_list, builtin_list], ids=["List[str]", "list[str]"])
def test_list_of_str_hint_becomes_array_of_string(t: Tool[..., Any]) -> None:
    assert only_property(t) == {"type": "array", "items": {"type": "string"}}
    assert_valid_schema(t)


@tool
def typing_dict(d: Dict[str, int]) -> None:  # noqa: UP006
    """typing.Dict."""


@tool
def bare_dict(d: dict) -> None:  # type: ignore[type-arg]
    """dict."""


@tool
def builtin_dict(d: dict[str, Any]) -> None:
    """dict[str, Any]."""


@pytest.mark.parametrize(
    "t", [typing_dict, bare_dict, builtin_dict], ids=["Dict[str, int]", "dict", "dict[str, Any]"]
)
def test_dict_hint_becomes_object(t: Tool[..., Any]) -> None:
    assert only_property(t)["type"] == "object"
    assert isinstance(t.validate({"d": {"k": 1}}), ValidArguments)
    assert isinstance(t.validate({"d": [1]}), InvalidArguments)
    assert_valid_schema(t)


def test_dict_value_hint_constrains_the_objects_values() -> None:
    assert only_property(typing_dict)["additionalProperties"] == {"type": "integer"}
    assert isinstance(typing_dict.validate({"d": {"k": "one"}}), InvalidArguments)


@tool
def optional(x: Optional[int]) -> None:  # noqa: UP045
    """Optional."""


@tool
def pipe_none(x: int | None) -> None:
    """X | None."""


@pytest.mark.parametrize("t", [optional, pipe_none], ids=["Optional[int]", "int | None"])
def test_optional_hint_becomes_type_or_null(t: Tool[..., Any]) -> None:
    assert only_property(t) == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert isinstance(t.validate({"x": None}), ValidArguments)
    assert isinstance(t.validate({"x": 3}), ValidArguments)
    assert isinstance(t.validate({"x": "3"}), InvalidArguments)


def test_optional_hint_without_default_is_still_required() -> None:
    assert optional.schema["required"] == ["x"]
    assert isinstance(optional.validate({}), InvalidArguments)


class Point(BaseModel):
    x: int
    y: int


@tool
def model_param(p: Point) -> int:
    """A pydantic model."""
    assert isinstance(p, Point)
    return p.x + p.y


def test_pydantic_model_hint_becomes_the_models_schema_by_ref() -> None:
    assert only_property(model_param) == {"$ref": "#/$defs/Point"}
    point = model_param.schema["$defs"]["Point"]
    assert point["properties"] == {"x": {"type": "integer"}, "y": {"type": "integer"}}
    assert point["required"] == ["x", "y"]
    assert_valid_schema(model_param)


def test_pydantic_model_parameter_receives_an_instance() -> None:
    checked = model_param.validate({"p": {"x": 1, "y": 2}})

    assert isinstance(checked, ValidArguments)
    assert checked.kwargs == {"p": Point(x=1, y=2)}
    assert model_param.invoke(checked.kwargs, ToolContext(call_id="c", run_id="r")) == 3


@tool
def list_of_models(points: list[Point]) -> None:
    """Models in a list."""


def test_list_of_pydantic_models_receives_instances() -> None:
    checked = list_of_models.validate({"points": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]})

    assert isinstance(checked, ValidArguments)
    assert checked.kwargs["points"] == [Point(x=1, y=2), Point(x=3, y=4)]
    assert_valid_schema(list_of_models)


@tool
def with_default(a: str, n: int = 7) -> None:
    """A default."""


def test_parameter_with_default_is_optional_and_default_is_applied() -> None:
    assert with_default.schema["required"] == ["a"]
    assert with_default.schema["properties"]["n"] == {"type": "integer", "default": 7}
    checked = with_default.validate({"a": "x"})
    assert isinstance(checked, ValidArguments)
    assert checked.kwargs == {"a": "x", "n": 7}


@tool
def all_optional(n: int = 1) -> None:
    """Nothing required."""


def test_tool_without_required_parameters_has_no_required_list_and_accepts_empty_object() -> None:
    assert "required" not in all_optional.schema
    assert isinstance(all_optional.validate({}), ValidArguments)


@tool
def anything(a, b: Any) -> None:  # type: ignore[no-untyped-def]
    """No hint and Any."""


def test_no_hint_and_any_accept_anything() -> None:
    assert anything.schema["properties"] == {"a": {}, "b": {}}
    assert anything.schema["required"] == ["a", "b"]
    for value in (1, "s", None, [1, "x"], {"k": [None]}, 2.5, True):
        checked = anything.validate({"a": value, "b": value})
        assert isinstance(checked, ValidArguments), value
        assert checked.kwargs == {"a": value, "b": value}


@tool
def no_parameters() -> str:
    """No parameters."""
    return "ok"


def test_tool_without_parameters_has_an_empty_object_schema() -> None:
    assert no_parameters.schema == {"type": "object", "properties": {}, "additionalProperties": False}
    assert isinstance(no_parameters.validate({}), ValidArguments)
    assert isinstance(no_parameters.validate({"x": 1}), InvalidArguments)


@pytest.mark.parametrize(
    "t",
    [
        schedule_visit,
        get_lab_result,
        send,
        scalars,
        literal,
        typing_list,
        typing_dict,
        bare_dict,
        optional,
        model_param,
        list_of_models,
        with_default,
        anything,
        no_parameters,
    ],
    ids=lambda t: t.name,
)
def test_every_schema_from_hints_forbids_extra_arguments_and_is_draft_2020_12(t: Tool[..., Any]) -> None:
    assert t.schema["additionalProperties"] is False
    assert t.schema["type"] == "object"
    jsonschema.Draft202012Validator.check_schema(t.schema)


# -- Annotated constraints: in the schema and enforced -----------------------------------------


@tool
def constrained(
    minutes: Annotated[int, Field(ge=5, le=240)],
    ref: Annotated[str, Field(pattern=r"^LAB-\d{5}$")],
    slots: Annotated[list[str], Field(min_length=1)],
) -> None:
    """Constrained arguments."""


GOOD = {"minutes": 30, "ref": "LAB-12345", "slots": ["a"]}


def test_annotated_field_constraints_appear_in_the_schema() -> None:
    props = constrained.schema["properties"]

    assert props["minutes"] == {"type": "integer", "minimum": 5, "maximum": 240}
    assert props["ref"] == {"type": "string", "pattern": r"^LAB-\d{5}$"}
    assert props["slots"] == {"type": "array", "items": {"type": "string"}, "minItems": 1}
    assert_valid_schema(constrained)


def test_annotated_constraints_accept_values_at_their_bounds() -> None:
    for minutes in (5, 240):
        assert isinstance(constrained.validate({**GOOD, "minutes": minutes}), ValidArguments)


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        ({"minutes": 4}, "minutes", "less than the minimum of 5"),
        ({"minutes": 241}, "minutes", "greater than the maximum of 240"),
        ({"ref": "LAB-1"}, "ref", "does not match"),
        ({"slots": []}, "slots", "should be non-empty"),
    ],
)
def test_annotated_constraints_are_enforced_by_validate(
    change: dict[str, Any], where: str, says: str
) -> None:
    checked = constrained.validate({**GOOD, **change})

    assert isinstance(checked, InvalidArguments)
    assert len(checked.problems) == 1
    assert checked.problems[0].startswith(f"{where}: ")
    assert says in checked.problems[0]


# -- hints refused at definition ---------------------------------------------------------------


class Plain:
    pass


@pytest.mark.parametrize(
    ("hint", "shown"),
    [
        (set[int], "set[int]"),
        (Set[str], "Set[str]"),  # noqa: UP006
        (tuple[int, int], "tuple[int, int]"),
        (Tuple[int], "Tuple[int]"),  # noqa: UP006
        (Union[int, str], "Union[int, str]"),  # noqa: UP007
        (int | str, "int | str"),
        (Plain, "Plain"),
        (datetime.datetime, "datetime"),
        (dict[int, str], "dict[int, str]"),
        (list[set[int]], "list[set[int]]"),
        (Optional[Plain], "Optional"),  # noqa: UP045
    ],
    ids=str,
)
def test_unsupported_hint_raises_type_error_naming_tool_parameter_and_hint(hint: Any, shown: str) -> None:
    def book(when: str, bad) -> None:  # type: ignore[no-untyped-def]
        """Has one bad hint."""

    book.__annotations__["bad"] = hint

    with pytest.raises(TypeError) as raised:
        tool(book)

    assert isinstance(raised.value, ToolDefinitionError)
    message = str(raised.value)
    assert "'book'" in message
    assert "'bad'" in message
    assert shown in message
    assert "'when'" not in message


def test_dict_with_non_str_keys_explains_why() -> None:
    def counts(by_id: dict[int, str]) -> None:
        """Int keys."""

    with pytest.raises(ToolDefinitionError, match="keys must be str"):
        tool(counts)


def test_literal_of_non_json_values_is_refused() -> None:
    def raw(kind: Literal[b"x"]) -> None:
        """Bytes literal."""

    with pytest.raises(ToolDefinitionError, match=r"'kind'.*JSON scalars"):
        tool(raw)


def test_star_args_and_star_star_kwargs_are_refused() -> None:
    def variadic(first: str, *args: int, **kwargs: str) -> None:
        """Variadic."""

    with pytest.raises(ToolDefinitionError) as raised:
        tool(variadic)

    message = str(raised.value)
    assert "'variadic'" in message
    assert "'args'" in message
    assert "'kwargs'" in message
    assert "'first'" not in message


def test_positional_only_parameters_are_refused() -> None:
    def positional(a: int, /) -> None:
        """Positional-only."""

    with pytest.raises(ToolDefinitionError, match=r"'a'.*positional-only"):
        tool(positional)


def test_parameter_starting_with_underscore_is_refused_not_silently_dropped() -> None:
    def hidden(_secret: str) -> None:
        """A private-looking name pydantic would drop from the schema."""

    with pytest.raises(ToolDefinitionError, match=r"'hidden'.*'_secret'"):
        tool(hidden)


def test_every_bad_hint_is_reported_in_one_error() -> None:
    def many(ok: str, a: set[int], b: Union[int, str], c: datetime.date) -> None:  # noqa: UP007
        """Three bad hints."""

    with pytest.raises(ToolDefinitionError) as raised:
        tool(many)

    message = str(raised.value)
    assert message.count("parameter ") == 3
    for name, hint in (("'a'", "set[int]"), ("'b'", "Union[int, str]"), ("'c'", "date")):
        assert name in message
        assert hint in message
    assert "'ok'" not in message


def test_unresolvable_forward_reference_is_a_definition_error() -> None:
    def forward(x: "NoSuchType") -> None:  # type: ignore[name-defined]  # noqa: F821
        """Forward reference to nothing."""

    with pytest.raises(ToolDefinitionError, match=r"'forward'.*cannot resolve"):
        tool(forward)


def test_decorating_something_not_callable_is_refused() -> None:
    with pytest.raises(ToolDefinitionError):
        tool(42)  # type: ignore[call-overload]


# -- names -------------------------------------------------------------------------------------


def test_name_is_the_function_name_by_default() -> None:
    assert schedule_visit.name == "schedule_visit"
    assert get_lab_result.name == "get_lab_result"


def test_name_argument_overrides_the_function_name() -> None:
    assert send.name == "send_message"
    assert send.fn.__name__ == "send"


@pytest.mark.parametrize("name", ["a", "A-z_09", "x" * 64, "lookup-order_v2"])
def test_name_of_letters_digits_underscore_dash_up_to_64_chars_is_accepted(name: str) -> None:
    t = tool(name=name)(lambda: None)
    assert t.name == name
    assert t.definition.name == name


@pytest.mark.parametrize(
    "name",
    ["", "x" * 65, "book visit", "book.visit", "book/visit", "réserver", "name\n", "\nname", "a:b"],
    ids=repr,
)
def test_name_outside_1_to_64_letters_digits_underscore_dash_is_refused(name: str) -> None:
    with pytest.raises(ToolDefinitionError, match="64"):
        tool(name=name)(lambda: None)


def test_lambda_without_name_is_refused_for_its_name() -> None:
    with pytest.raises(ToolDefinitionError, match="<lambda>"):
        tool(lambda: None)


# -- descriptions ------------------------------------------------------------------------------


def test_description_is_the_cleaned_docstring() -> None:
    def look_up(order_id: str) -> None:
        """Look an order up.

            Ids look like ORD-123.
        Use it before a refund.
        """

    expected = "Look an order up.\n\n    Ids look like ORD-123.\nUse it before a refund."
    assert tool(look_up).description == expected


def test_one_line_docstring_is_the_description() -> None:
    assert schedule_visit.description == "Book a visit in the first free slot. Slots are ISO 8601 times."


def test_description_argument_overrides_the_docstring() -> None:
    assert send.description == "Send a message to the care team."

    @tool(description="Explicit.")
    def documented() -> None:
        """Docstring."""

    assert documented.description == "Explicit."


def test_no_docstring_gives_an_empty_description() -> None:
    def bare() -> None:
        pass

    assert tool(bare).description == ""


# -- ToolContext -------------------------------------------------------------------------------


@tool
def with_context(order_id: str, ctx: ToolContext) -> dict[str, str]:
    """Uses its context."""
    return {"order_id": order_id, "call_id": ctx.call_id, "run_id": ctx.run_id}


def test_tool_context_parameter_is_left_out_of_the_schema() -> None:
    assert with_context.schema["properties"] == {"order_id": {"type": "string"}}
    assert with_context.schema["required"] == ["order_id"]
    assert "ctx" not in json.dumps(with_context.schema)


def test_model_cannot_pass_the_context_parameter() -> None:
    checked = with_context.validate({"order_id": "O-1", "ctx": {"call_id": "forged"}})

    assert isinstance(checked, InvalidArguments)
    assert "ctx" in checked.problems[0]


def test_invoke_fills_the_context_parameter() -> None:
    checked = with_context.validate({"order_id": "O-1"})
    assert isinstance(checked, ValidArguments)

    result = with_context.invoke(checked.kwargs, ToolContext(call_id="call-7", run_id="run-3"))

    assert result == {"order_id": "O-1", "call_id": "call-7", "run_id": "run-3"}


def test_invoke_fills_a_context_parameter_of_any_name_and_position() -> None:
    @tool
    def first(context: ToolContext, n: int) -> str:
        """Context first."""
        return f"{context.call_id}:{n}"

    assert first.schema["properties"] == {"n": {"type": "integer"}}
    assert first.invoke({"n": 2}, ToolContext(call_id="c9", run_id="r")) == "c9:2"


def test_send_message_from_the_page_takes_only_text() -> None:
    assert send.schema["properties"] == {"text": {"type": "string"}}
    assert send.schema["required"] == ["text"]


# -- async tools -------------------------------------------------------------------------------


@tool
async def fetch(order_id: str) -> dict[str, str]:
    """Async."""
    await asyncio.sleep(0)
    return {"order_id": order_id}


def test_async_tool_is_marked_async_and_sync_tool_is_not() -> None:
    assert fetch.is_async is True
    assert send.is_async is True
    assert schedule_visit.is_async is False


def test_async_tool_schema_comes_from_its_hints() -> None:
    assert fetch.schema["properties"] == {"order_id": {"type": "string"}}


def test_invoking_an_async_tool_gives_a_coroutine_to_await() -> None:
    result = asyncio.run(fetch.invoke({"order_id": "O-1"}, ToolContext(call_id="c", run_id="r")))
    assert result == {"order_id": "O-1"}


# -- flags -------------------------------------------------------------------------------------


def test_flags_default_to_none_set_and_not_retryable() -> None:
    assert (schedule_visit.read_only, schedule_visit.idempotent, schedule_visit.destructive) == (
        False,
        False,
        False,
    )
    assert schedule_visit.retryable is False


def test_read_only_tool_is_retryable() -> None:
    assert get_lab_result.read_only is True
    assert get_lab_result.retryable is True


def test_idempotent_tool_is_retryable() -> None:
    @tool(idempotent=True)
    def put(key: str) -> None:
        """Idempotent."""

    assert put.idempotent is True
    assert put.retryable is True


def test_destructive_tool_is_never_retryable() -> None:
    assert send.destructive is True
    assert send.retryable is False


@pytest.mark.parametrize("other", [{"read_only": True}, {"idempotent": True}])
def test_destructive_together_with_read_only_or_idempotent_is_refused(other: dict[str, bool]) -> None:
    def wipe(record_id: str) -> None:
        """Deletes."""

    with pytest.raises(ToolDefinitionError, match=r"'wipe'.*destructive"):
        tool(destructive=True, **other)(wipe)


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_non_positive_timeout_is_refused(timeout: float) -> None:
    with pytest.raises(ToolDefinitionError, match="timeout_secs"):
        tool(name="slow", timeout_secs=timeout)(lambda: None)


# -- definition --------------------------------------------------------------------------------


def test_definition_has_name_description_parameters_and_flags() -> None:
    d = send.definition
    assert (d.name, d.description) == ("send_message", "Send a message to the care team.")
    assert d.parameters == send.schema
    assert (d.read_only, d.idempotent, d.destructive, d.queue) == (
        send.read_only, send.idempotent, send.destructive, send.queue
    )
    assert d.schema_hash == send.schema_hash
    assert schedule_visit.definition.parameters == schedule_visit.schema


def test_definition_round_trips_through_json() -> None:
    d = schedule_visit.definition
    assert ToolDefinition.model_validate_json(d.model_dump_json()) == d


def test_changing_a_definition_changes_nothing_the_tool_validates_against() -> None:
    d = send.definition
    d.parameters["properties"].clear()
    assert send.definition.parameters == send.schema != d.parameters


def test_schema_hash_changes_with_the_definition() -> None:
    def v(n: int) -> None:
        """One."""

    assert tool(v).schema_hash == tool(v).schema_hash
    assert tool(v).schema_hash != tool(description="Two.")(v).schema_hash


# -- tool_from_schema --------------------------------------------------------------------------

REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "orderId": {"type": "string", "pattern": "^ORD-"},
        "amount": {"type": "number", "exclusiveMinimum": 0},
    },
    "required": ["orderId", "amount"],
    "additionalProperties": False,
}


def refund_fn(orderId: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    return {"refunded": amount, "orderId": orderId, "call": ctx.call_id}


def make_refund(**options: Any) -> Tool[..., Any]:
    return tool_from_schema(
        name="issue_refund", description="Refund an order.", parameters=REFUND_SCHEMA, fn=refund_fn, **options
    )


def test_tool_from_schema_keeps_the_schema_as_given() -> None:
    refund = make_refund()

    assert refund.schema == REFUND_SCHEMA
    assert refund.definition.model_dump(include={"name", "description", "parameters"}) == {
        "name": "issue_refund",
        "description": "Refund an order.",
        "parameters": REFUND_SCHEMA,
    }


def test_tool_from_schema_validates_calls_against_the_schema() -> None:
    refund = make_refund()

    good = refund.validate({"orderId": "ORD-1", "amount": 12.5})
    bad = refund.validate({"orderId": "X-1", "amount": 0, "extra": True})

    assert good == ValidArguments({"orderId": "ORD-1", "amount": 12.5})
    assert isinstance(bad, InvalidArguments)
    assert len(bad.problems) == 3
    assert any(p.startswith("orderId: ") for p in bad.problems)
    assert any(p.startswith("amount: ") for p in bad.problems)
    assert any("extra" in p for p in bad.problems)


def test_tool_from_schema_fills_the_context_parameter() -> None:
    refund = make_refund()

    result = refund.invoke({"orderId": "ORD-1", "amount": 3}, ToolContext(call_id="c-1", run_id="r"))

    assert result == {"refunded": 3, "orderId": "ORD-1", "call": "c-1"}


def test_tool_from_schema_takes_flags() -> None:
    refund = make_refund(destructive=True)
    assert refund.destructive is True
    assert refund.retryable is False
    with pytest.raises(ToolDefinitionError):
        make_refund(destructive=True, read_only=True)


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"a": {"type": "strin"}}},
        {"type": "object", "required": "a"},
        {"type": "object", "properties": {"a": {"minimum": "five"}}},
        {"type": "object", "minProperties": -1},
    ],
    ids=["bad-type", "required-not-array", "minimum-not-number", "negative-minProperties"],
)
def test_tool_from_schema_with_an_invalid_schema_raises_at_definition(parameters: dict[str, Any]) -> None:
    with pytest.raises(ToolDefinitionError, match=r"'bad'.*invalid JSON Schema"):
        tool_from_schema(name="bad", description="d", parameters=parameters, fn=lambda **kw: None)


def test_tool_from_schema_must_describe_an_object() -> None:
    with pytest.raises(ToolDefinitionError, match="'object'"):
        tool_from_schema(name="arr", description="d", parameters={"type": "array"}, fn=lambda **kw: None)


def test_tool_from_schema_async_function_is_async() -> None:
    async def run(**kwargs: Any) -> str:
        return "x"

    t = tool_from_schema(name="a", description="d", parameters={"type": "object"}, fn=run)
    assert t.is_async is True


# -- calling the tool object directly ----------------------------------------------------------


def test_calling_the_tool_calls_the_function() -> None:
    assert schedule_visit("P-1", "clinic", ["09:00", "10:00"], duration_minutes=45) == {
        "booked": "09:00",
        "kind": "clinic",
        "minutes": 45,
    }
    assert get_lab_result(test_id="LAB-12345") == {"test_id": "LAB-12345", "status": "final"}


def test_calling_the_tool_directly_skips_validation() -> None:
    # The direct call is the plain function: handy in unit tests, and not a way in for a model.
    assert model_param(Point(x=2, y=3)) == 5
    assert with_default("a") is None


def test_calling_an_async_tool_directly_gives_its_coroutine() -> None:
    assert asyncio.run(fetch("O-2")) == {"order_id": "O-2"}


def test_tool_repr_names_the_tool() -> None:
    assert repr(send) == "<Tool send_message>"


def test_a_parameter_name_pydantic_keeps_for_itself_is_refused_at_definition() -> None:
    def configure(model_config: str) -> str:
        return model_config

    with pytest.raises(TypeError, match="model_config"):
        tool(configure)


def test_changing_the_schema_a_tool_shows_does_not_change_what_it_accepts() -> None:
    @tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    shown = shout.schema
    shown["properties"]["text"]["type"] = "integer"
    shown["required"] = []
    assert shout.schema["properties"]["text"] == {"type": "string"}
    assert shout.validate({}).__class__.__name__ == "InvalidArguments"
