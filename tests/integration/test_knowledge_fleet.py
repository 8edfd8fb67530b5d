"""Collections and memory on a real fleet (prefork and threads): the tools run on a worker, the
documents live in PostgreSQL and the memories in the fleet's Redis."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from criogenai import Agent, Dispatcher, Settings, ToolCall
from criogenai.documents import Collection, PostgresStore
from tests.conftest import WorkerProcess, fleet_url, start_worker
from tests.memory_script import prompt, scripted_model, seen

TABLE = f"crg_test_{uuid.uuid4().hex[:10]}"
os.environ["CRIOGENAI_TEST_DOCS_TABLE"] = TABLE  # read by tests.knowledge_tools, here and in the worker

from tests import knowledge_tools  # noqa: E402


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresStore]:
    store = PostgresStore(knowledge_tools.POSTGRES, table=TABLE)
    yield store
    store.drop()
    store.close()


@pytest.fixture(scope="module", params=["prefork", "threads"])
def worker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_up: None,
           pg: PostgresStore) -> Iterator[WorkerProcess]:
    redis.Redis.from_url(fleet_url()).flushdb()
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("knowledge"), pool=request.param, concurrency=4,
                     tools="tests.knowledge_tools", extra_env={"CRIOGENAI_TEST_DOCS_TABLE": TABLE})
    yield w
    w.stop()


def settings() -> Settings:
    return Settings(broker_url=fleet_url(), lease_secs=2.0)


def test_a_collection_tool_searches_postgresql_from_the_worker(worker: WorkerProcess, pg: PostgresStore,
                                                               tmp_path: Path) -> None:
    docs = Collection("handbook", pg)
    docs.add("refunds.md", "# Refunds\n\nRefunds are paid within 30 days.", format="markdown")
    docs.add("hours.txt", "The clinic opens at eight and closes at six.")
    with Dispatcher([knowledge_tools.search_handbook], settings=settings()) as d:
        results = d.run_turn_sync([
            ToolCall(id="a", name="search_handbook", arguments={"query": "when does the clinic open"}),
            ToolCall(id="b", name="search_handbook", arguments={"query": "refunds'; DROP TABLE x; --\x00"}),
            ToolCall(id="c", name="search_handbook", arguments={"query": "'; --"}),
        ])
    assert results[0].status == "ok" and results[0].content.startswith("[1] hours.txt (part 1")
    assert results[1].status == "ok" and results[1].content.startswith("[1] refunds.md")
    assert results[2].status == "invalid_arguments"
    assert docs.count() == 2  # nothing was dropped


def test_two_users_on_the_fleet_never_see_each_others_memories(worker: WorkerProcess) -> None:
    run = uuid.uuid4().hex[:6]
    users = {f"alice-{run}": "penicillin", f"bob-{run}": "latex"}
    with Agent(scripted_model(), memory=knowledge_tools.memory, settings=settings()) as agent:

        async def both() -> list[tuple[str, str]]:
            async def one(user: str, what: str) -> tuple[str, str]:
                out = await agent.run(prompt(
                    [("remember", {"text": f"{user} is allergic to {what}"})],
                    [("search_memory", {"query": "allergic penicillin latex", "user": "x"}),
                     ("search_memory", {"query": "allergic penicillin latex"})],
                ), user=user)
                return user, out.output

            return await asyncio.gather(*(one(u, w) for u, w in users.items() for _ in range(2)))

        for user, output in asyncio.run(both()):
            remembered, forged, found = seen(output)
            assert remembered["status"] == "ok", remembered
            assert forged["status"] == "invalid_arguments"
            hits = json.loads(found["content"])
            assert hits and all(h["text"].startswith(user) for h in hits), (user, hits)
    client = redis.Redis.from_url(fleet_url())
    for user in users:
        key = f"crg:mem:{{fleet-test:{user}}}"
        assert client.hlen(key) == 2 and 0 < client.ttl(key) <= 90 * 24 * 3600


def test_forget_and_the_count_cap_on_the_fleet(worker: WorkerProcess) -> None:
    user = f"carol-{uuid.uuid4().hex[:6]}"
    with Agent(scripted_model(), memory=knowledge_tools.memory, settings=settings()) as agent:
        out = seen(agent.run_sync(prompt(
            [("remember", {"text": "one"}), ("remember", {"text": "two"}), ("remember", {"text": "three"})],
            [("remember", {"text": "four"}), ("remember", {"text": "x" * 201})],
        ), user=user).output)
        assert [m["status"] for m in out] == ["ok", "ok", "ok", "tool_error", "invalid_arguments"]
        assert "memory is full (3 memories)" in out[3]["content"]
        first = json.loads(out[0]["content"])["id"]
        out = seen(agent.run_sync(prompt(
            [("forget", {"id": first})],
            [("remember", {"text": "four"})],  # a turn's calls run at once: the search comes after
            [("search_memory", {"query": "one two three four"})],
        ), user=user).output)
        assert out[0]["content"] == f"Forgot {first}."
        assert out[1]["status"] == "ok"
        assert sorted(h["text"] for h in json.loads(out[2]["content"])) == ["four", "three", "two"]
