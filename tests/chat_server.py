"""A local stand-in for an OpenAI-compatible chat-completions server, in a thread of the test.

It answers ``POST /v1/chat/completions`` with scripted replies and keeps every request (headers
and JSON body), so a test can assert the wire format both ways. Never the internet.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, Any]] | Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A chat-completions reply body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}
        ],
    }


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One tool call as the API sends it: arguments are a JSON string (or whatever the model wrote)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class ChatServer:
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                server.paths.append(self.path)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                server.requests.append(body)
                if not server.replies:
                    status, out = 500, {"error": {"message": "the test server's script is exhausted"}}
                else:
                    reply = server.replies.pop(0)
                    status, out = reply(body) if callable(reply) else reply
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@contextmanager
def chat_server(replies: list[Reply]) -> Iterator[ChatServer]:
    server = ChatServer(replies)
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
