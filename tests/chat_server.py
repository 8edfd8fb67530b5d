"""A local stand-in for a model API server (OpenAI chat completions, Anthropic Messages), in a thread.

It answers every POST with scripted replies and keeps every request (headers and JSON body) and
every reply body, so a test can assert the wire format both ways. A successful reply without a
``model`` gets the requested one, as the real APIs do. Never the internet.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, dict[str, Any]] | tuple[int, dict[str, Any], dict[str, str]]
"""Status and body, and optionally headers to send (``retry-after``, say)."""
Reply = Answer | Callable[[dict[str, Any]], Answer]


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A chat-completions reply body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop",
             "logprobs": None}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One tool call as the API sends it: arguments are a JSON string (or whatever the model wrote)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def anthropic_message(
    text: str | None = None, tool_uses: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A Messages API reply: a text block (if any), then the tool_use blocks."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += tool_uses or []
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": "tool_use" if tool_uses else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tool_use block as the Messages API sends it: the input is an object."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


class ChatServer:
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.sent: list[dict[str, Any]] = []
        """Every reply body with a status below 400, as sent."""
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
                    status, out, *more = reply(body) if callable(reply) else reply
                headers: dict[str, str] = more[0] if more else {}
                if status < 400:
                    out = {**out, "model": out.get("model", body.get("model"))}
                    server.sent.append(out)
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429 and not headers:
                    self.send_header("Retry-After", "0")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """The server without ``/v1``: Anthropic's base URL (the client adds ``/v1/messages``)."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@contextmanager
def chat_server(replies: list[Reply]) -> Iterator[ChatServer]:
    server = ChatServer(replies)
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
