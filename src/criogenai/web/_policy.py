"""WebPolicy: where the web tools may connect, set by the application and never by the model.

The checks here are pure: a URL's scheme and host, and each address a host resolves to. The
transport (``_transport.py``) applies the address check to every connection it opens, after DNS
resolution, and connects to the address it checked.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx

from .._errors import ConfigurationError
from .._version import __version__

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_USER_AGENT = f"criogenai/{__version__} (AI agent web tool; respects robots.txt)"
"""What the tools send as User-Agent; robots.txt rules for ``criogenai`` (or ``*``) apply."""

ROBOTS_AGENT = "criogenai"

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200")
)
"""Cloud metadata and credential endpoints (AWS/GCP/Azure, AWS IPv6, ECS task roles, Alibaba):
refused whatever the policy allows."""

_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(Exception):
    """A request the policy does not allow; the message says why without naming internal addresses."""


@dataclass(frozen=True)
class WebPolicy:
    """Where and how the web tools may fetch. Every field is the application's choice.

    By default only public addresses are reachable: loopback, private, link-local, multicast,
    reserved and cloud-metadata addresses are refused after DNS resolution, on every redirect.
    ``allow_hosts`` (exact names or ``*.example.com``) narrows reading to those hosts;
    ``allow_networks`` opens non-public networks on purpose (an intranet wiki); ``allow_loopback``
    is the switch for tests against local servers. Metadata addresses stay refused always.
    """

    allow_hosts: tuple[str, ...] | None = None
    allow_networks: tuple[str, ...] = ()
    allow_loopback: bool = False
    robots_txt: bool = True
    user_agent: str = DEFAULT_USER_AGENT
    timeout_secs: float = 15.0
    """Each connect and each read; the whole fetch (redirects included) gets twice this."""
    max_redirects: int = 5
    max_bytes: int = 5_000_000
    """The body is cut here, counted after decompression."""
    verify_tls: bool = True
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)
    """Your own CAs (an internal PKI); the system's CAs otherwise."""
    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            nets = tuple(ipaddress.ip_network(n, strict=False) for n in self.allow_networks)
        except ValueError as exc:
            raise ConfigurationError(f"WebPolicy.allow_networks: {exc}") from exc
        if self.allow_loopback:
            nets += _LOOPBACK
        object.__setattr__(self, "_networks", nets)
        if isinstance(self.allow_hosts, str):
            raise ConfigurationError("WebPolicy.allow_hosts is a tuple of host names, not one string")
        if self.allow_hosts is not None:
            object.__setattr__(self, "allow_hosts", tuple(h.lower().rstrip(".") for h in self.allow_hosts))
        if not self.timeout_secs > 0 or self.max_redirects < 0 or self.max_bytes < 1:
            raise ConfigurationError("WebPolicy: timeout_secs > 0, max_redirects >= 0 and max_bytes >= 1")

    def check_url(self, url: httpx.URL) -> None:
        """Refuse a URL by its form: scheme, credentials, host not on the allow-list."""
        if url.scheme not in ("http", "https"):
            raise Refused(f"only http and https URLs can be read, not {url.scheme or 'a relative'!r} URLs")
        if not url.host:
            raise Refused("the URL has no host")
        if url.userinfo:
            raise Refused("URLs with a user name or password are refused")
        host = url.host.lower().rstrip(".")
        if self.allow_hosts is not None and not any(fnmatch.fnmatchcase(host, p) for p in self.allow_hosts):
            raise Refused(f"{host} is not on this tool's list of allowed hosts")

    def check_address(self, host: str, address: IPAddress) -> None:
        """Refuse an address the host resolved to unless it is public or explicitly allowed."""
        for addr in _embedded(address):
            if addr in METADATA_ADDRESSES:
                raise Refused(f"{host} resolves to a cloud metadata address")
            if any(addr in net for net in self._networks):
                continue
            kind = _non_public_kind(addr)
            if kind is not None:
                raise Refused(f"{host} resolves to a {kind} address, which this tool may not reach")


def _embedded(address: IPAddress) -> Iterable[IPAddress]:
    """The addresses to check: an IPv4-mapped address as its IPv4 address; any other address and
    the IPv4 address it carries (6to4, NAT64), each."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        yield address.ipv4_mapped
        return
    yield address
    if isinstance(address, ipaddress.IPv6Address):
        if address.sixtofour is not None:
            yield address.sixtofour
        if address in _NAT64:
            yield ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


def _non_public_kind(addr: IPAddress) -> str | None:
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_multicast:
        return "multicast"
    if addr.is_private:
        return "private"
    if isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local:  # fec0::/10: deprecated, not global
        return "site-local"
    if addr.is_unspecified or addr.is_reserved or not addr.is_global:
        return "reserved"
    return None
