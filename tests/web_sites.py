"""Local HTTP servers for the web tools' tests, the pages they serve, and the loopback guard.

``Site`` is a real HTTP server on a loopback address (stdlib ``http.server``) whose routes are
functions of the request; ``hits`` records every request it got, Host header included.
``only_loopback`` fails a test that tried to connect anywhere outside 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import threading
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

Route = Callable[["Handler"], None]

ARTICLE = """<!doctype html><html><head><meta charset="utf-8">
<title>The Otter Report | Coast News</title></head>
<body>
<nav class="menu"><ul><li><a href="/">Home</a></li><li><a href="/about">About us</a></li>
<li><a href="/shop">NAVMARKER shop</a></li></ul></nav>
<div class="advert" id="ad-top">ADMARKER Buy cheap watches now, limited offer!</div>
<article>
<h1>The Otter Report</h1>
<p>Sea otters use rocks as tools to open shellfish, a behaviour seen in few other mammals. They keep
a favourite rock in a pouch of loose skin under the forearm and carry it from dive to dive.</p>
<h2>Habitat</h2>
<p>They live along the coasts of the northern Pacific, in kelp forests where they rest wrapped in
fronds so that the current does not carry them away while they sleep.</p>
<ul><li>Kelp forests</li><li>Rocky shores</li></ul>
<p>Otters have the densest fur of any animal, up to a million hairs per square centimetre, which
keeps them warm in cold water without the blubber that seals and whales rely on.</p>
</article>
<aside class="sidebar"><div class="ad">ADMARKER sponsored links: casino bonus</div></aside>
<footer>FOOTMARKER Copyright 2024 Coast News. All rights reserved.</footer>
</body></html>"""

ARTICLE_SENTENCE = "Sea otters use rocks as tools to open shellfish"
BOILERPLATE = ("NAVMARKER", "ADMARKER", "FOOTMARKER", "About us")


def article(body_text: str, title: str = "A page") -> str:
    """A small article page around ``body_text`` (several paragraphs, so it counts as main text)."""
    paragraphs = "".join(f"<p>{body_text} Paragraph {i} goes on about it at length.</p>" for i in range(4))
    return (f"<html><head><title>{title}</title></head><body><nav>NAVMARKER</nav>"
            f"<article><h1>{title}</h1>{paragraphs}</article></body></html>")


class Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        hit = (self.path, self.headers.get("Host", ""), self.headers.get("User-Agent", ""))
        self.server.site.hits.append(hit)
        route = self.server.site.routes.get(self.path.split("?", 1)[0])
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if route is None:
                self.reply(404, b"not found", "text/plain")
            else:
                route(self)

    def reply(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    site: Site


class Site:
    """A local HTTP server; add routes with ``site.routes[path] = fn(handler)``."""

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: list[tuple[str, str, str]] = []
        self.server_names: list[str | None] = []
        """The TLS SNI of each handshake."""
        self.stop = threading.Event()
        self.server = _Server((host, 0), Handler)
        self.server.site = self
        self.scheme = "http"
        if tls is not None:
            tls.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.host, self.port = host, self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/", host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.host}:{self.port}{path}"

    def page(self, path: str, body: str | bytes, ctype: str = "text/html; charset=utf-8",
             headers: dict[str, str] | None = None) -> str:
        data = body.encode() if isinstance(body, str) else body
        self.routes[path] = lambda h: h.reply(200, data, ctype, headers)
        return self.url(path)

    def redirect(self, path: str, to: str, status: int = 302) -> str:
        self.routes[path] = lambda h: h.reply(status, b"", "text/plain", {"Location": to})
        return self.url(path)

    def paths(self) -> list[str]:
        return [p for p, _, _ in self.hits]

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def running(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> Iterator[Site]:
    site = Site(host, tls)
    try:
        yield site
    finally:
        site.close()


# -- routes for the hard cases -------------------------------------------------------------------


def endless(total: int) -> Route:
    """``total`` bytes of text, streamed in 64 KiB writes (the client is expected to stop early)."""
    def route(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(total))
        h.end_headers()
        chunk = b"x" * 65536
        for _ in range(total // len(chunk)):
            h.wfile.write(chunk)
    return route


def gzip_bomb(inflated: int) -> tuple[Route, int]:
    """A gzip body of ``inflated`` zero bytes (about a thousandth of that on the wire)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    data = b"".join(packer.compress(block) for _ in range(inflated >> 20)) + packer.flush()

    def route(h: Handler) -> None:
        h.reply(200, data, "text/plain", {"Content-Encoding": "gzip"})
    return route, len(data)


def slow(site: Site, secs: float) -> Route:
    """Answers only after ``secs`` (or when the site closes)."""
    def route(h: Handler) -> None:
        if not site.stop.wait(secs):
            h.reply(200, b"late", "text/plain")
    return route


def searx_results(query: str) -> bytes:
    """A SearxNG ``format=json`` answer in the shape SearxNG sends."""
    return json.dumps({
        "query": query, "number_of_results": 2,
        "results": [
            {"url": "https://otters.example/facts", "title": "Otter <span>facts</span>",
             "content": "Sea otters &amp; their rocks", "engine": "duckduckgo", "score": 1.0,
             "category": "general", "engines": ["duckduckgo"], "positions": [1]},
            {"url": "https://kelp.example/", "title": "Kelp forests", "content": "Where otters sleep",
             "engine": "bing", "score": 0.5, "category": "general", "engines": ["bing"], "positions": [2]},
        ],
        "answers": [], "corrections": [], "infoboxes": [], "suggestions": ["sea otter"],
        "unresponsive_engines": [],
    }).encode()


def brave_results(query: str) -> bytes:
    """A Brave Web Search API answer in the shape Brave sends."""
    return json.dumps({
        "type": "search", "query": {"original": query},
        "web": {"type": "search", "results": [
            {"title": "Sea Otter - Wikipedia", "url": "https://wiki.example/Sea_otter",
             "description": "The <strong>sea otter</strong> is a marine mammal", "type": "search_result",
             "language": "en", "family_friendly": True},
        ]},
    }).encode()


# -- the guard -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def only_loopback(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every TCP connect in this process must go to 127.0.0.0/8: anything else is refused before a
    packet leaves and fails the test at teardown, even if the code under test swallowed the error."""
    attempts: list[object] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def allowed(sock: socket.socket, address: Any) -> bool:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return True
        try:
            ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip in ipaddress.ip_network("127.0.0.0/8")

    def connect(sock: socket.socket, address: Any) -> None:
        if not allowed(sock, address):
            attempts.append(address)
            raise ConnectionRefusedError(f"test guard: no connection outside 127.0.0.0/8 ({address!r})")
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        if not allowed(sock, address):
            attempts.append(address)
            raise ConnectionRefusedError(f"test guard: no connection outside 127.0.0.0/8 ({address!r})")
        return real_connect_ex(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield attempts
    if attempts:
        pytest.fail(f"the code under test tried to connect outside 127.0.0.0/8: {attempts}")
