"""criogenai.web on a real fleet: a worker subprocess on each pool reads local pages, searches a
local SearxNG, and refuses loopback under the default policy.

The page server and the SearxNG stand-in are local servers this module starts; the worker's tool
module (tests/web_tools.py) opens loopback for ``read_page`` only, as an application's tests would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from criogenai import Dispatcher, Settings, ToolCall, ToolRegistry
from tests.conftest import WorkerProcess, fleet_url, start_worker
from tests.web_sites import ARTICLE, ARTICLE_SENTENCE, BOILERPLATE, Site, only_loopback, searx_results

__all__ = ["only_loopback"]  # the autouse guard, for this (the dispatcher's) process


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    s = Site()
    s.page("/robots.txt", "User-agent: *\nDisallow: /private/\n", "text/plain")
    s.page("/otters", ARTICLE)
    s.redirect("/old-otters", "/otters", 301)
    s.page("/private/otters", ARTICLE)
    s.routes["/search"] = lambda h: h.reply(200, searx_results("otters"), "application/json")
    yield s
    s.close()


@pytest.fixture(scope="module", params=["prefork", "threads"])
def worker(request: pytest.FixtureRequest, site: Site, tmp_path_factory: pytest.TempPathFactory,
           redis_up: None) -> Iterator[WorkerProcess]:
    redis.Redis.from_url(fleet_url()).flushdb()
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("web"), pool=request.param, concurrency=2,
                     tools="tests.web_tools", extra_env={"CRIOGENAI_TEST_SEARX_URL": site.url("/")})
    yield w
    w.stop()


def run(*calls: ToolCall) -> list[dict[str, object]]:
    settings = Settings(broker_url=fleet_url(), lease_secs=2.0)
    registry = ToolRegistry.from_catalog(sorted({c.name for c in calls}), settings)
    with Dispatcher(registry, settings=settings) as d:
        return [r.model_dump() for r in d.run_turn_sync(list(calls))]


def test_a_worker_reads_a_page_follows_its_redirect_and_respects_robots_txt(
    worker: WorkerProcess, site: Site
) -> None:
    page, private = run(
        ToolCall(id="c1", name="read_page", arguments={"url": site.url("/old-otters")}),
        ToolCall(id="c2", name="read_page", arguments={"url": site.url("/private/otters")}),
    )
    assert page["status"] == "ok", page
    got = json.loads(str(page["content"]))
    assert got["url"] == site.url("/otters") and got["title"] == "The Otter Report"
    assert ARTICLE_SENTENCE in got["text"] and not any(junk in got["text"] for junk in BOILERPLATE)
    assert private["status"] == "tool_error" and "robots.txt" in str(private["content"])


def test_the_default_policy_on_a_worker_refuses_loopback_without_connecting(
    worker: WorkerProcess, site: Site
) -> None:
    before = len(site.hits)
    [result] = run(ToolCall(id="c1", name="read_page_strict", arguments={"url": site.url("/otters")}))
    assert result["status"] == "tool_error" and result["attempts"] == 1
    assert "refused" in str(result["content"]) and "loopback" in str(result["content"])
    assert len(site.hits) == before


def test_a_worker_searches_through_searxng(worker: WorkerProcess, site: Site) -> None:
    [result] = run(ToolCall(id="c1", name="web_search", arguments={"query": "sea otters", "count": 2}))
    assert result["status"] == "ok", result
    assert json.loads(str(result["content"]))["results"] == [
        {"title": "Otter facts", "url": "https://otters.example/facts",
         "snippet": "Sea otters & their rocks"},
        {"title": "Kelp forests", "url": "https://kelp.example/", "snippet": "Where otters sleep"},
    ]
