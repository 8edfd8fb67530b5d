"""What a store on Redis raises is criogenai's ``StoreError`` (``StoreUnavailable`` when Redis does
not answer or refuses the client), with redis-py's error as its cause, from every public entry:
approvals, the catalog, ``fetch_full``, run records, memories, the result cache."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from criogenai import (
    Approvals,
    Catalog,
    ResultCache,
    Settings,
    StoreError,
    StoreUnavailable,
    fetch_full,
    tool,
)
from criogenai._refusals import refusal
from criogenai.agent._runs import make_records
from criogenai.dispatcher import HookCall
from criogenai.memory import RedisMemoryStore
from tests.conftest import OwnRedis


@tool(read_only=True)
def lookup(term: str) -> str:
    """Look a term up."""
    return term


def _entries(settings: Settings) -> dict[str, Callable[[], Any]]:
    cache = ResultCache(60, settings=settings)
    assert settings.redis_url
    return {
        "approvals": lambda: Approvals(settings).pending(),
        "catalog": lambda: Catalog.from_settings(settings).read(),
        "fetch_full": lambda: fetch_full("r1", "c1", settings=settings),
        "run records": lambda: make_records(settings).state("r1"),
        "memories": lambda: RedisMemoryStore(str(settings.redis_url)).all("ns", "u1"),
        "cache": lambda: cache.before(HookCall("lookup", {"term": "x"}, "r1", "c1", lookup)),
    }


def test_a_stopped_redis_raises_store_unavailable_from_every_store(own_redis: OwnRedis) -> None:
    settings = Settings(broker_url=own_redis.url)
    for name, attempt in _entries(settings).items():
        if name == "fetch_full":
            with pytest.raises(LookupError):  # Redis is up: no such result
                attempt()
        else:
            assert attempt() in ([], {}, None), name  # Redis is up: nothing stored yet
    own_redis.stop()
    for name, attempt in _entries(settings).items():
        with pytest.raises(StoreUnavailable) as caught:
            attempt()
        assert isinstance(caught.value.__cause__, redis.ConnectionError), name
        assert "Redis did not answer" in str(caught.value), name


def test_a_refused_password_is_store_unavailable_that_says_so(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = OwnRedis(tmp_path, port, password="right-password")
    server.start()
    try:
        settings = Settings(broker_url=f"redis://:wrong-password@127.0.0.1:{port}/0")
        with pytest.raises(StoreUnavailable) as caught:
            Approvals(settings).pending()
        assert "refused the credentials" in str(caught.value)
        assert refusal(caught.value) is not None  # workers and dispatchers still tell it from an outage
    finally:
        server.stop()


def test_a_failed_command_is_a_store_error(own_redis: OwnRedis) -> None:
    settings = Settings(broker_url=own_redis.url)
    redis.Redis.from_url(own_redis.url).set("crg:{r1}:approvals", "not a hash")
    with pytest.raises(StoreError) as caught:
        Approvals(settings).pending("r1")
    assert not isinstance(caught.value, StoreUnavailable)
    assert isinstance(caught.value.__cause__, redis.ResponseError)
    assert "WRONGTYPE" in str(caught.value)
