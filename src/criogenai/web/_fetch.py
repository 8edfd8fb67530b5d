"""Fetch one URL under a WebPolicy: redirects followed by hand (each hop checked), robots.txt, a
body cap counted after decompression, and a deadline over the whole fetch.

Content-Encoding is decoded here with zlib and an output bound, rather than by httpx, whose
decoder inflates each network chunk whole: one 64 KiB chunk of a gzip bomb becomes ~64 MB.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import httpx
from protego import Protego

from .._errors import ToolError
from ._policy import ROBOTS_AGENT, Refused, WebPolicy
from ._transport import vetted_client

_REDIRECTS = (301, 302, 303, 307, 308)
_ROBOTS_MAX_BYTES = 500_000
_ROBOTS_TTL_SECS = 3600.0


@dataclass(frozen=True)
class Fetched:
    """A response body as read: at most ``max_bytes``, decoded from its Content-Encoding."""

    url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool


class _Deadline:
    def __init__(self, secs: float) -> None:
        self.end = time.monotonic() + secs

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise httpx.ReadTimeout("the whole fetch took too long")


def fetch(url: str, policy: WebPolicy) -> Fetched:
    """Read ``url`` as the policy allows; ToolError (retryable when trying again may help) otherwise."""
    try:
        target = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ToolError(f"not a valid URL: {exc}") from exc
    deadline = _Deadline(policy.timeout_secs * 2)
    try:
        with vetted_client(policy) as client:
            return _follow(client, target, policy, deadline)
    except Refused as exc:
        raise ToolError(f"refused: {exc}") from None
    except httpx.TimeoutException:
        raise ToolError(f"timed out reading {target}", retryable=True) from None
    except httpx.TransportError as exc:
        raise ToolError(f"could not read {target}: {type(exc).__name__}", retryable=True) from None


def _follow(client: httpx.Client, url: httpx.URL, policy: WebPolicy, deadline: _Deadline) -> Fetched:
    seen: set[str] = set()
    for _ in range(policy.max_redirects + 1):
        policy.check_url(url)
        if str(url) in seen:
            raise ToolError(f"redirect loop at {url}")
        seen.add(str(url))
        if policy.robots_txt and not _robots_allow(client, url, policy, deadline):
            raise ToolError(f"{url} is disallowed by the site's robots.txt")
        with client.stream("GET", url) as response:
            if response.status_code in _REDIRECTS and "location" in response.headers:
                try:
                    url = url.join(response.headers["location"])
                except httpx.InvalidURL as exc:
                    raise ToolError(f"{url} redirects to an invalid URL: {exc}") from None
                continue
            if response.status_code >= 400:
                retry = response.status_code == 429 or response.status_code >= 500
                raise ToolError(f"{url} answered HTTP {response.status_code}", retryable=retry)
            body, truncated = _read_body(response, policy.max_bytes, deadline)
            ctype = response.headers.get("content-type", "")
            return Fetched(
                url=str(url),
                status=response.status_code,
                content_type=ctype.split(";", 1)[0].strip().lower(),
                charset=response.charset_encoding,
                body=body,
                truncated=truncated,
            )
    raise ToolError(f"more than {policy.max_redirects} redirects from the URL given")


def _read_body(response: httpx.Response, cap: int, deadline: _Deadline) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of the decoded body, and whether there was more."""
    decoder = _decoder(response.headers.get("content-encoding", ""))
    out = bytearray()
    for chunk in response.iter_raw():
        deadline.check()
        if decoder is None:
            out += chunk
        else:
            data = chunk
            # max_length bounds what one step inflates; the rest waits in unconsumed_tail.
            while data and len(out) <= cap:
                try:
                    out += decoder.decompress(data, cap + 1 - len(out))
                except zlib.error:
                    raise ToolError("the body does not decompress as its Content-Encoding says") from None
                data = decoder.unconsumed_tail
        if len(out) > cap:
            return bytes(out[:cap]), True
    return bytes(out), False


def _decoder(encoding: str) -> zlib._Decompress | None:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS)
    raise ToolError(f"the server sent an unsupported Content-Encoding: {encoding}")


# -- robots.txt -----------------------------------------------------------------------------------

_robots_cache: OrderedDict[str, tuple[float, Protego | None]] = OrderedDict()
_robots_lock = threading.Lock()


def _robots_allow(client: httpx.Client, url: httpx.URL, policy: WebPolicy, deadline: _Deadline) -> bool:
    """RFC 9309: a missing robots.txt (4xx) allows everything; an unreachable one (5xx, network
    error) disallows, and the call may be tried again. Parsed files are kept an hour per site."""
    origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
    with _robots_lock:
        cached = _robots_cache.get(origin)
    if cached is None or cached[0] < time.monotonic():
        rules = _load_robots(client, httpx.URL(origin + "/robots.txt"), policy, deadline)
        with _robots_lock:
            _robots_cache[origin] = (time.monotonic() + _ROBOTS_TTL_SECS, rules)
            _robots_cache.move_to_end(origin)
            while len(_robots_cache) > 256:
                _robots_cache.popitem(last=False)
    else:
        rules = cached[1]
    return rules is None or bool(rules.can_fetch(str(url), ROBOTS_AGENT))


def _load_robots(
    client: httpx.Client, url: httpx.URL, policy: WebPolicy, deadline: _Deadline
) -> Protego | None:
    for _ in range(policy.max_redirects + 1):
        policy.check_url(url)
        with client.stream("GET", url) as response:
            if response.status_code in _REDIRECTS and "location" in response.headers:
                url = url.join(response.headers["location"])
                continue
            if 400 <= response.status_code < 500:
                return None
            if response.status_code >= 500:
                raise ToolError(f"{url} answered HTTP {response.status_code}", retryable=True)
            body, _ = _read_body(response, _ROBOTS_MAX_BYTES, deadline)
            return Protego.parse(body.decode("utf-8", errors="replace"))
    return None
