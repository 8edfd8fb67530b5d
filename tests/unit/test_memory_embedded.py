"""Memory on the embedded engine: scopes the model cannot cross, the three tools, caps, stores."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from criogenai import Agent, Settings
from criogenai._signing import refusal, sign
from criogenai._wire import ToolCall, ToolTask
from criogenai.memory import LocalMemoryStore, Memory
from tests.memory_script import prompt, scripted_model, seen

EMBEDDED = Settings()


def agent_with(memory: Memory) -> Agent:
    return Agent(scripted_model(), memory=memory, settings=EMBEDDED)


def test_the_model_gets_three_memory_tools_with_schemas_that_name_no_scope() -> None:
    memory = Memory(LocalMemoryStore())
    remember, forget, search = memory.tools
    assert [t.name for t in memory.tools] == ["remember", "forget", "search_memory"]
    assert remember.schema["required"] == ["text"] and remember.schema["additionalProperties"] is False
    assert forget.schema["required"] == ["id"]
    assert set(search.schema["properties"]) == {"query", "limit"}
    assert "forget" in remember.description and "id" in search.description
    assert remember.idempotent and forget.idempotent and search.read_only


def test_two_users_at_once_never_see_each_others_memories() -> None:
    agent = agent_with(Memory(LocalMemoryStore()))

    def script(fact: str) -> str:
        return prompt(
            [("remember", {"text": fact})],
            [("search_memory", {"query": "allergy penicillin latex"})],
        )

    async def both() -> list[str]:
        runs = [
            agent.run(script(f"{who} is allergic to {what}"), user=who)
            for _ in range(5)
            for who, what in (("alice", "penicillin"), ("bob", "latex"))
        ]
        return [r.output for r in await asyncio.gather(*runs)]

    outputs = asyncio.run(both())
    for i, out in enumerate(outputs):
        who, other = ("alice", "bob") if i % 2 == 0 else ("bob", "alice")
        remembered, found = seen(out)
        assert remembered["status"] == "ok" and json.loads(remembered["content"])["id"].startswith("m-")
        hits = json.loads(found["content"])
        assert hits and all(h["text"].startswith(who) for h in hits)
        assert other not in found["content"]
        assert {"id", "text", "created", "score"} <= set(hits[0])
    agent.close()


def test_arguments_naming_another_scope_are_refused_and_ids_of_another_scope_do_nothing() -> None:
    memory = Memory(LocalMemoryStore())
    agent = agent_with(memory)
    bob = seen(agent.run_sync(prompt([("remember", {"text": "bob's PIN is 4321"})]), user="bob").output)
    bob_id = json.loads(bob[0]["content"])["id"]

    out = seen(agent.run_sync(prompt(
        [("search_memory", {"query": "PIN", "user": "bob"}),
         ("search_memory", {"query": "PIN", "scope": "bob"}),
         ("remember", {"text": "x", "user": "bob"})],
        [("forget", {"id": bob_id}), ("search_memory", {"query": "bob PIN 4321"})],
    ), user="mallory").output)
    assert [m["status"] for m in out[:3]] == ["invalid_arguments"] * 3
    assert "'user' was unexpected" in out[0]["content"]
    assert out[3] == {"name": "forget", "status": "ok",
                      "content": f"There is no memory {bob_id} (already forgotten, or never made)."}
    assert json.loads(out[4]["content"]) == []
    assert [r.text for r in memory.store.all("default", "bob")] == ["bob's PIN is 4321"]
    agent.close()


def test_forget_removes_a_memory_and_search_no_longer_finds_it() -> None:
    agent = agent_with(Memory(LocalMemoryStore()))
    first = seen(agent.run_sync(prompt([("remember", {"text": "prefers morning appointments"})]),
                                user="u").output)
    mid = json.loads(first[0]["content"])["id"]
    out = seen(agent.run_sync(prompt(
        [("search_memory", {"query": "morning appointments"})],
        [("forget", {"id": mid})],
        [("search_memory", {"query": "morning appointments"})],
    ), user="u").output)
    assert [h["id"] for h in json.loads(out[0]["content"])] == [mid]
    assert out[1]["content"] == f"Forgot {mid}."
    assert json.loads(out[2]["content"]) == []
    agent.close()


def test_past_the_caps_calls_get_clear_errors() -> None:
    agent = agent_with(Memory(LocalMemoryStore(), max_chars=50, max_memories=2))
    out = seen(agent.run_sync(prompt(
        [("remember", {"text": "x" * 51})],
        [("remember", {"text": "one"})],
        [("remember", {"text": "two"})],
        [("remember", {"text": "three"})],
    ), user="u").output)
    assert out[0]["status"] == "invalid_arguments" and "is too long" in out[0]["content"]
    assert [m["status"] for m in out[1:]] == ["ok", "ok", "tool_error"]
    assert out[3]["content"] == "memory is full (2 memories): forget some that no longer matter first"
    agent.close()


def test_without_a_user_the_memory_tools_say_so() -> None:
    agent = agent_with(Memory(LocalMemoryStore()))
    out = seen(agent.run_sync(prompt([("remember", {"text": "x"})])).output)
    assert out[0]["status"] == "tool_error" and "named no user" in out[0]["content"]
    agent.close()


def test_a_file_store_keeps_memories_for_the_next_process(tmp_path: Path) -> None:
    path = str(tmp_path / "memories.db")
    agent = agent_with(Memory(LocalMemoryStore(path), namespace="clinic"))
    agent.run_sync(prompt([("remember", {"text": "takes warfarin daily"})]), user="p1")
    agent.close()
    later = Memory(LocalMemoryStore(path), namespace="clinic")
    assert [r.text for r in later.store.all("clinic", "p1")] == ["takes warfarin daily"]
    assert later.store.all("other", "p1") == []  # namespaces are apart too


def test_search_ranks_by_relevance_and_limits() -> None:
    store = LocalMemoryStore()
    agent = agent_with(Memory(store))
    facts = ["likes green tea", "works night shifts at the hospital", "green car, parked at the hospital",
             "dog named Rex", "allergic to cats"]
    agent.run_sync(prompt([("remember", {"text": f}) for f in facts]), user="u")
    out = seen(agent.run_sync(prompt([("search_memory", {"query": "hospital night", "limit": 2})]),
                              user="u").output)
    hits = json.loads(out[0]["content"])
    assert [h["text"] for h in hits] == ["works night shifts at the hospital",
                                         "green car, parked at the hospital"]
    assert time.time() - 60 < time.mktime(time.strptime(hits[0]["created"][:19], "%Y-%m-%dT%H:%M:%S")) + 86400
    agent.close()


def test_the_scope_is_covered_by_the_calls_signature() -> None:
    secret = "s" * 32
    task = ToolTask(run_id="r", call=ToolCall(id="c", name="search_memory", arguments={"query": "x"}),
                    timeout_secs=5, max_attempts=1, initial_backoff_secs=0, max_backoff_secs=0, jitter=0,
                    on_tool_exception="return_to_model", max_result_chars=100, deadline=time.time() + 60,
                    scope="alice")
    signed = sign(task, secret)
    assert refusal(signed, secret) is None
    forged = signed.model_copy(update={"scope": "bob"})
    assert refusal(forged, secret) is not None and "does not match" in (refusal(forged, secret) or "")
    assert refusal(signed.model_copy(update={"scope": None}), secret) is not None
    # A call without a scope signs as before the field existed.
    plain = task.model_copy(update={"scope": None})
    assert "scope" not in plain.model_dump(mode="json")


def test_a_retried_run_keeps_its_user() -> None:
    agent = agent_with(Memory(LocalMemoryStore()))
    result = agent.run_sync(prompt([("remember", {"text": "kept"})]), user="carol")
    assert agent.store.state(result.run_id).user == "carol"
    with pytest.raises(Exception, match="scope"):
        agent.run_sync("[]", user="{bad}")
    agent.close()


def test_a_namespace_cannot_hold_the_colon_that_ends_it_in_a_memory_key() -> None:
    """Namespace "a:b" with user "c" and namespace "a" with user "b:c" would share one hash."""
    from criogenai import ConfigurationError

    with pytest.raises(ConfigurationError, match="memory namespace 'a:b'"):
        Memory(namespace="a:b")
    assert Memory(namespace="clinic.v2-eu_1").namespace == "clinic.v2-eu_1"
