"""A TCP proxy in front of the test Redis that loses one reply: Redis runs the command, the
connection breaks before its answer reaches the client (a network cut at the worst moment)."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading

from tests.conftest import FLEET_DB, REDIS_BASE


def script_sha(script: str) -> bytes:
    """What an EVALSHA of ``script`` carries on the wire."""
    return hashlib.sha1(script.encode()).hexdigest().encode()


class ReplyDropper:
    """Listens on a free local port and passes every connection through to the test Redis, except
    that the first reply starting with ``reply`` (an integer, by default) to a command carrying
    ``trigger`` is not passed back: both sides of that connection are closed instead. Only that
    once; ``dropped`` is set when it happened."""

    def __init__(self, trigger: bytes, reply: bytes = b":") -> None:
        self._reply = reply
        host_port = REDIS_BASE.removeprefix("redis://").split("/")[0]
        host, _, port = host_port.partition(":")
        self._upstream = (host or "127.0.0.1", int(port or 6379))
        self._trigger = trigger
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.dropped = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = FLEET_DB) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self._upstream)
            with self._lock:
                self._socks += [client, upstream]
            armed = threading.Event()  # this connection sent the trigger: its next integer reply goes
            threading.Thread(target=self._up, args=(client, upstream, armed), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, armed), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, armed: threading.Event) -> None:
        tail = b""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if not self.dropped.is_set() and self._trigger in tail + data:
                    armed.set()  # before Redis can answer
                tail = data[-len(self._trigger):]
                upstream.sendall(data)
        _close(client, upstream)

    def _down(self, upstream: socket.socket, client: socket.socket, armed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if armed.is_set() and data.startswith(self._reply):
                    with self._lock:
                        first = not self.dropped.is_set()
                        self.dropped.set()
                    if first:
                        break  # Redis ran it; its answer is lost with the connection
                client.sendall(data)
        _close(client, upstream)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            _close(*self._socks)

    def __enter__(self) -> ReplyDropper:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()
