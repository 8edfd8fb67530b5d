"""An httpx client that connects only to addresses its WebPolicy allows, the addresses it checked.

The check sits in httpcore's network backend, the one place a TCP connection is opened: the host
is resolved once, every address is checked, and the socket connects to a checked address. TLS
(SNI and certificate) and the Host header still use the URL's name, because httpcore passes those
on separately, so there is no window in which a second DNS answer could point elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from ._policy import IPAddress, Refused, WebPolicy


class _VettingBackend(httpcore.SyncBackend):
    """httpcore's own socket backend, given a resolved and checked address instead of a name."""

    def __init__(self, policy: WebPolicy) -> None:
        self.policy = policy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = _resolve(host, port)
        for address in addresses:
            self.policy.check_address(host, address)
        last: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(str(address), port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise Refused("Unix sockets are refused")


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
    found: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        # An IPv6 scope ("fe80::1%eth0") is dropped: the address alone decides, and link-local is refused.
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise httpcore.ConnectError(f"{host} has no IPv4 or IPv6 address")
    return found


class _VettingTransport(httpx.HTTPTransport):
    """httpx's transport over a pool whose every connection goes through ``_VettingBackend``."""

    def __init__(self, policy: WebPolicy) -> None:
        tls = policy.ssl_context or httpx.create_ssl_context(verify=policy.verify_tls, trust_env=False)
        super().__init__(verify=tls, trust_env=False)
        # httpx has no public switch for httpcore's network backend; this swaps the pool it built.
        self._pool = httpcore.ConnectionPool(
            ssl_context=tls,
            max_connections=10,
            network_backend=_VettingBackend(policy),
        )


def vetted_client(policy: WebPolicy) -> httpx.Client:
    """A client that follows no redirect by itself, uses no proxy from the environment and sends
    the policy's user agent; every connection it opens is checked against ``policy``."""
    return httpx.Client(
        transport=_VettingTransport(policy),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(policy.timeout_secs),
        headers={"User-Agent": policy.user_agent, "Accept-Encoding": "gzip, deflate"},
    )
