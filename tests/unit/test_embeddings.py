"""The embeddings client against a local OpenAI-compatible ``/v1/embeddings`` server, and memory
ranked by meaning with it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from criogenai import Agent, Settings
from criogenai.memory import EmbeddingError, LocalMemoryStore, Memory, OpenAIEmbeddings
from tests.memory_script import prompt, scripted_model, seen

CONCEPTS = [{"dog", "puppy", "canine", "hound"}, {"car", "vehicle", "automobile", "sedan"},
            {"coffee", "espresso", "caffeine"}]


def vector(text: str) -> list[float]:
    words = set(text.lower().replace(",", " ").split())
    return [float(len(words & c)) + 0.01 * i for i, c in enumerate(CONCEPTS)]


class EmbeddingServer:
    """Answers POST /v1/embeddings with concept vectors; ``fail_first`` requests get a 503."""

    def __init__(self, fail_first: int = 0, status: int = 503) -> None:
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.fail_first, self.status = fail_first, status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                outer.auth.append(self.headers.get("Authorization"))
                if self.path != "/v1/embeddings" or len(outer.requests) <= outer.fail_first:
                    self._send(outer.status if self.path == "/v1/embeddings" else 404, {"error": "no"})
                    return
                data = [{"object": "embedding", "index": i, "embedding": vector(t)}
                        for i, t in reversed(list(enumerate(body["input"])))]
                self._send(200, {"object": "list", "data": data, "model": body["model"]})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[EmbeddingServer]:
    s = EmbeddingServer()
    yield s
    s.close()


def test_vectors_come_back_in_input_order_with_the_key_sent(server: EmbeddingServer) -> None:
    e = OpenAIEmbeddings("test-embed", base_url=server.url, api_key="k-123")
    assert e.embed(["a dog", "a car"]) == [vector("a dog"), vector("a car")]
    assert server.requests == [{"model": "test-embed", "input": ["a dog", "a car"]}]
    assert server.auth == ["Bearer k-123"]


def test_busy_servers_are_retried_and_refusals_are_clear() -> None:
    flaky = EmbeddingServer(fail_first=2)
    try:
        embedder = OpenAIEmbeddings("m", base_url=flaky.url, initial_backoff=0.01)
        assert embedder.embed(["dog"]) == [vector("dog")]
        assert len(flaky.requests) == 3
    finally:
        flaky.close()
    down = EmbeddingServer(fail_first=99)
    try:
        with pytest.raises(EmbeddingError, match="no embeddings after 2 attempts: HTTP 503"):
            OpenAIEmbeddings("m", base_url=down.url, max_attempts=2, initial_backoff=0.01).embed(["dog"])
    finally:
        down.close()
    refused = EmbeddingServer(fail_first=99, status=401)
    try:
        with pytest.raises(EmbeddingError, match="refused the request: HTTP 401"):
            OpenAIEmbeddings("m", base_url=refused.url).embed(["dog"])
        assert len(refused.requests) == 1
    finally:
        refused.close()


def test_memory_with_an_embedder_finds_memories_by_meaning(server: EmbeddingServer) -> None:
    memory = Memory(LocalMemoryStore(), embedder=OpenAIEmbeddings("m", base_url=server.url))
    with Agent(scripted_model(), memory=memory, settings=Settings()) as agent:
        out = seen(agent.run_sync(prompt(
            [("remember", {"text": "has a puppy called Rex"}), ("remember", {"text": "drives a sedan"}),
             ("remember", {"text": "drinks espresso at noon"})],
            [("search_memory", {"query": "canine", "limit": 1}),
             ("search_memory", {"query": "automobile", "limit": 1})],
        ), user="u").output)
    found = [json.loads(m["content"])[0]["text"] for m in out[3:]]
    assert found == ["has a puppy called Rex", "drives a sedan"]
