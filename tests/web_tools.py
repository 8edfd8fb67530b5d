"""The web tools as an application's tool module defines them, for the fleet tests
(tests/integration/test_web_fleet.py). The worker's tests point them at local servers.

The resolver stub of the unit tests cannot reach a worker process, so here loopback is opened by
the tool's own policy (the application-side switch), and ``read_page_strict`` keeps the default.
Like the unit tests' guard, this module refuses any connection outside 127.0.0.0/8 in the worker.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

from criogenai.web import SearxNG, WebPolicy, page_reader, web_search

read_page = page_reader(WebPolicy(allow_loopback=True, timeout_secs=5))
read_page_strict = page_reader(name="read_page_strict")
search = web_search(SearxNG(os.environ.get("CRIOGENAI_TEST_SEARX_URL", "http://127.0.0.1:9")))

_real_connect = socket.socket.connect


def _loopback_only(sock: socket.socket, address: Any) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
        if ip not in ipaddress.ip_network("127.0.0.0/8"):
            raise ConnectionRefusedError(f"test guard: no connection outside 127.0.0.0/8 ({address!r})")
    _real_connect(sock, address)


socket.socket.connect = _loopback_only  # type: ignore[method-assign]
