"""Checking a call's arguments before any code runs: Tool.validate and the dispatcher's check_turn."""

from typing import Annotated, Any, Optional

import pytest
from examples.clinic import Address, get_lab_result, schedule_visit, send
from pydantic import BaseModel, Field, field_validator, model_validator

from criogenai import Dispatcher, Limits, Settings, ToolCall, ToolError, tool
from criogenai.dispatcher._validate import check_turn
from criogenai.tools import InvalidArguments, ToolRegistry, ValidArguments

GOOD = {"patient_ref": "P-1", "kind": "home", "slots": ["2025-01-01T09:00"]}


def problems_of(result: ValidArguments | InvalidArguments) -> list[str]:
    assert isinstance(result, InvalidArguments), result
    return result.problems


# -- valid arguments ---------------------------------------------------------------------------


def test_valid_arguments_get_the_defaults_of_omitted_parameters() -> None:
    checked = schedule_visit.validate(GOOD)

    assert checked == ValidArguments({**GOOD, "duration_minutes": 30, "note": None, "address": None})


def test_valid_arguments_keep_the_values_given() -> None:
    checked = schedule_visit.validate({**GOOD, "duration_minutes": 45, "note": "ring twice"})

    assert isinstance(checked, ValidArguments)
    assert checked.kwargs["duration_minutes"] == 45
    assert checked.kwargs["note"] == "ring twice"


def test_valid_arguments_instantiate_pydantic_models() -> None:
    address = {"street": "1 Main St", "city": "Lyon", "postcode": "69001"}

    checked = schedule_visit.validate({**GOOD, "address": address})

    assert isinstance(checked, ValidArguments)
    assert isinstance(checked.kwargs["address"], Address)
    assert checked.kwargs["address"].city == "Lyon"


def test_validate_does_not_change_the_arguments_it_is_given() -> None:
    arguments = dict(GOOD)

    schedule_visit.validate(arguments)

    assert arguments == GOOD


def test_null_for_an_optional_argument_is_valid() -> None:
    assert isinstance(schedule_visit.validate({**GOOD, "note": None, "address": None}), ValidArguments)


# -- invalid arguments: every problem, each naming where ---------------------------------------


def test_every_problem_is_reported_each_naming_where() -> None:
    arguments = {
        "kind": "hospital",
        "slots": ["09:00", 10],
        "duration_minutes": "thirty",
        "address": {"street": "1 Main St", "city": 69},
        "urgent": True,
    }

    problems = problems_of(schedule_visit.validate(arguments))

    assert sorted(problems) == sorted(
        [
            "arguments: 'patient_ref' is a required property",
            "arguments: Additional properties are not allowed ('urgent' was unexpected)",
            "kind: 'hospital' is not one of ['home', 'clinic', 'video']",
            "slots[1]: 10 is not of type 'string'",
            "duration_minutes: 'thirty' is not of type 'integer'",
            "address.city: 69 is not of type 'string'",
            "address: 'postcode' is a required property",
        ]
    )


def test_every_missing_required_argument_is_reported() -> None:
    problems = problems_of(schedule_visit.validate({}))

    assert sorted(problems) == [
        "arguments: 'kind' is a required property",
        "arguments: 'patient_ref' is a required property",
        "arguments: 'slots' is a required property",
    ]


def test_array_items_are_named_by_index() -> None:
    problems = problems_of(schedule_visit.validate({**GOOD, "slots": ["09:00", 1, "11:00", None]}))

    assert problems == ["slots[1]: 1 is not of type 'string'", "slots[3]: None is not of type 'string'"]


def test_every_bad_field_of_an_optional_model_is_reported_by_its_path() -> None:
    problems = problems_of(
        schedule_visit.validate({**GOOD, "address": {"street": 1, "city": 2, "postcode": 3}})
    )

    assert problems == [
        "address.street: 1 is not of type 'string'",
        "address.city: 2 is not of type 'string'",
        "address.postcode: 3 is not of type 'string'",
    ]


def test_every_missing_field_of_an_optional_model_is_reported() -> None:
    problems = problems_of(schedule_visit.validate({**GOOD, "address": {"street": "1 Main St"}}))

    assert problems == [
        "address: 'city' is a required property",
        "address: 'postcode' is a required property",
    ]


@pytest.mark.parametrize(("argument", "value"), [("address", "1 Main St"), ("note", 5)])
def test_wrong_type_for_an_optional_argument_names_the_argument(argument: str, value: object) -> None:
    problems = problems_of(schedule_visit.validate({**GOOD, argument: value}))

    assert len(problems) == 1
    assert problems[0].startswith(f"{argument}: ")


@pytest.mark.parametrize(
    ("value", "kind"),
    [(True, "boolean"), ("30", "string"), (30.5, "number"), (None, "null")],
)
def test_an_integer_argument_takes_no_other_json_type(value: object, kind: str) -> None:
    problems = problems_of(schedule_visit.validate({**GOOD, "duration_minutes": value}))

    assert problems == [f"duration_minutes: {value!r} is not of type 'integer'"]


def test_an_enum_argument_is_case_sensitive() -> None:
    problems = problems_of(schedule_visit.validate({**GOOD, "kind": "Home"}))

    assert problems == ["kind: 'Home' is not one of ['home', 'clinic', 'video']"]


@tool
def book(
    slots: Annotated[list[str], Field(min_length=1)],
    duration_minutes: Annotated[int, Field(ge=5, le=240)] = 30,
    ref: Annotated[str, Field(pattern=r"^P-\d+$")] = "P-0",
) -> None:
    """Constrained like the TypeScript schedule_visit."""


def test_empty_array_for_a_min_items_argument_should_be_non_empty() -> None:
    assert problems_of(book.validate({"slots": []})) == ["slots: [] should be non-empty"]


def test_every_constraint_broken_is_reported() -> None:
    problems = problems_of(book.validate({"slots": [], "duration_minutes": 241, "ref": "X-1"}))

    assert problems == [
        "slots: [] should be non-empty",
        "duration_minutes: 241 is greater than the maximum of 240",
        "ref: 'X-1' does not match '^P-\\\\d+$'",
    ]


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [([], "array"), (["P-1"], "array"), ("P-1", "string"), (None, "null"), (7, "integer"), (True, "boolean")],
    ids=repr,
)
def test_arguments_that_are_not_a_json_object_are_a_problem(arguments: object, kind: str) -> None:
    problems = problems_of(schedule_visit.validate(arguments))

    assert problems == [f"arguments: expected a JSON object, got {kind}"]


def test_arguments_for_a_tool_without_parameters_must_still_be_an_object() -> None:
    @tool
    def ping() -> str:
        """No arguments."""
        return "pong"

    assert ping.validate({}) == ValidArguments({})
    assert problems_of(ping.validate(None)) == ["arguments: expected a JSON object, got null"]
    assert problems_of(ping.validate({"x": 1})) == [
        "arguments: Additional properties are not allowed ('x' was unexpected)"
    ]


# -- a pydantic model's own validators: what JSON Schema cannot say ----------------------------


class Visit(BaseModel):
    start: int
    end: int

    @model_validator(mode="after")
    def _end_after_start(self) -> "Visit":
        if self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class Patient(BaseModel):
    name: str
    visits: list[Visit] = []

    @field_validator("name")
    @classmethod
    def _capitalised(cls, value: str) -> str:
        if not value[:1].isupper():
            raise ValueError("names start with a capital")
        return value


@tool
def plan(patients: list[Patient], lead: Optional[Patient] = None) -> int:  # noqa: UP045
    """Plan visits for patients."""
    return len(patients)


def test_model_validator_problems_are_reported_with_their_path() -> None:
    visits = [{"start": 1, "end": 2}, {"start": 3, "end": 1}]

    problems = problems_of(plan.validate({"patients": [{"name": "Ann", "visits": visits}]}))

    assert problems == ["patients[0].visits[1]: Value error, end must be after start"]


def test_field_validator_problems_are_all_reported_with_their_paths() -> None:
    arguments = {"patients": [{"name": "Ann"}, {"name": "bob"}], "lead": {"name": "eve"}}

    problems = problems_of(plan.validate(arguments))

    assert problems == [
        "patients[1].name: Value error, names start with a capital",
        "lead.name: Value error, names start with a capital",
    ]


def test_model_validators_run_only_on_arguments_that_fit_the_schema() -> None:
    # The schema is checked first; the model's refinements then see well-typed values only.
    problems = problems_of(
        plan.validate({"patients": [{"name": "bob", "visits": [{"start": "a", "end": 1}]}]})
    )

    assert problems == ["patients[0].visits[0].start: 'a' is not of type 'integer'"]


def test_arguments_passing_the_model_validators_become_instances() -> None:
    checked = plan.validate({"patients": [{"name": "Ann", "visits": [{"start": 1, "end": 2}]}]})

    assert isinstance(checked, ValidArguments)
    assert checked.kwargs["patients"] == [Patient(name="Ann", visits=[Visit(start=1, end=2)])]
    assert checked.kwargs["lead"] is None


class City(BaseModel):
    name: str

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value == "Atlantis":
            raise ToolError("no such city: Atlantis; try a real one")
        if value == "Bug":
            raise RuntimeError("the lookup table is at /etc/secret-path")
        return value


@tool
def forecast(city: City) -> str:
    """The weather in a city."""
    return "sunny"


def test_a_tool_error_raised_by_an_argument_validator_is_the_models_invalid_arguments() -> None:
    assert problems_of(forecast.validate({"city": {"name": "Atlantis"}})) == [
        "arguments: no such city: Atlantis; try a real one"
    ]


def test_a_turn_goes_on_when_a_validator_raises_and_the_other_calls_run() -> None:
    calls = [
        ToolCall(id="a", name="forecast", arguments={"city": {"name": "Bug"}}),
        ToolCall(id="b", name="forecast", arguments={"city": {"name": "Lyon"}}),
    ]

    with Dispatcher([forecast], settings=Settings()) as d:
        results = d.run_turn_sync(calls)

    assert [(r.call_id, r.status) for r in results] == [("a", "invalid_arguments"), ("b", "ok")]
    assert "secret-path" not in results[0].content


# -- check_turn: the dispatcher's look at a whole turn -----------------------------------------

REGISTRY = ToolRegistry([schedule_visit, get_lab_result, send])


def call(call_id: str, name: str, arguments: Any = None) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments={} if arguments is None else arguments)


def test_check_turn_passes_valid_calls_through_in_order() -> None:
    calls = [call("c1", "get_lab_result", {"test_id": "LAB-1"}), call("c2", "schedule_visit", GOOD)]

    valid, done = check_turn(calls, REGISTRY, Limits(), "run-1")

    assert [(v.call.id, v.tool.name) for v in valid] == [("c1", "get_lab_result"), ("c2", "schedule_visit")]
    assert done == {}


def test_unknown_tool_lists_the_tools_there_are() -> None:
    calls = [call("c1", "delete_everything"), call("c2", "get_lab_result", {"test_id": "LAB-1"})]

    valid, done = check_turn(calls, REGISTRY, Limits(), "run-1")

    assert [v.call.id for v in valid] == ["c2"]
    result = done["c1"]
    assert result.status == "unknown_tool"
    assert result.run_id == "run-1"
    assert result.name == "delete_everything"
    assert "'delete_everything'" in result.content
    assert "get_lab_result, schedule_visit, send_message" in result.content
    assert result.artifact == {"available": ["get_lab_result", "schedule_visit", "send_message"]}
    assert result.attempts == 0


def test_invalid_arguments_carry_every_problem_in_content_and_artifact() -> None:
    calls = [call("c1", "schedule_visit", {"kind": "x", "slots": [1]})]

    valid, done = check_turn(calls, REGISTRY, Limits(), "run-1")

    assert valid == []
    result = done["c1"]
    assert result.status == "invalid_arguments"
    problems = [
        "arguments: 'patient_ref' is a required property",
        "kind: 'x' is not one of ['home', 'clinic', 'video']",
        "slots[0]: 1 is not of type 'string'",
    ]
    assert result.artifact is not None
    assert sorted(result.artifact["problems"]) == sorted(problems)  # type: ignore[arg-type]
    assert result.content.startswith("Invalid arguments for tool 'schedule_visit':\n")
    for problem in problems:
        assert f"\n- {problem}" in result.content


def test_non_object_arguments_in_a_call_are_invalid_arguments() -> None:
    valid, done = check_turn([call("c1", "get_lab_result", ["LAB-1"])], REGISTRY, Limits(), "r")

    assert valid == []
    assert done["c1"].status == "invalid_arguments"
    assert "expected a JSON object, got array" in done["c1"].content


def test_oversized_arguments_are_invalid_arguments_before_validation() -> None:
    limits = Limits(max_argument_bytes=100)
    calls = [
        call("big", "schedule_visit", {**GOOD, "note": "x" * 200}),
        call("small", "schedule_visit", {**GOOD, "note": "x"}),
    ]

    valid, done = check_turn(calls, REGISTRY, limits, "run-1")

    assert [v.call.id for v in valid] == ["small"]
    result = done["big"]
    assert result.status == "invalid_arguments"
    assert "at most 100 are allowed" in result.content
    assert result.artifact is not None
    assert len(result.artifact["problems"]) == 1  # type: ignore[arg-type]


def test_argument_size_is_counted_in_utf8_bytes() -> None:
    # 40 characters, 120 bytes of UTF-8: over a 100-byte limit.
    arguments = {"test_id": "€" * 40}

    _, done = check_turn(
        [call("c1", "get_lab_result", arguments)], REGISTRY, Limits(max_argument_bytes=100), "r"
    )

    assert done["c1"].status == "invalid_arguments"
    assert "bytes" in done["c1"].content


def test_turn_over_max_calls_per_turn_refuses_every_call() -> None:
    calls = [call(f"c{i}", "get_lab_result", {"test_id": f"LAB-{i}"}) for i in range(3)]

    valid, done = check_turn(calls, REGISTRY, Limits(max_calls_per_turn=2), "run-1")

    assert valid == []
    assert set(done) == {"c0", "c1", "c2"}
    for result in done.values():
        assert result.status == "invalid_arguments"
        assert "3 calls" in result.content
        assert "at most 2" in result.content


def test_turn_of_exactly_max_calls_per_turn_is_allowed() -> None:
    calls = [call(f"c{i}", "get_lab_result", {"test_id": f"LAB-{i}"}) for i in range(2)]

    valid, done = check_turn(calls, REGISTRY, Limits(max_calls_per_turn=2), "run-1")

    assert len(valid) == 2
    assert done == {}


def test_duplicate_call_ids_in_a_turn_raise_value_error() -> None:
    calls = [
        call("same", "get_lab_result", {"test_id": "LAB-1"}),
        call("same", "send_message", {"text": "hi"}),
    ]

    with pytest.raises(ValueError, match="'same'"):
        check_turn(calls, REGISTRY, Limits(), "run-1")


def test_empty_turn_has_nothing_to_run() -> None:
    assert check_turn([], REGISTRY, Limits(), "run-1") == ([], {})
