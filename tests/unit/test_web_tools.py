"""criogenai.web in this process: page reading, search providers and the SSRF refusals.

Every server is a local one the test starts. ``only_loopback`` (autouse) fails any test that
tried to connect outside 127.0.0.0/8, so a refusal that broke would fail here instead of sending
traffic. ``resolver`` is a DNS stub: the names it knows resolve to the addresses an attacker would
aim at, and every other name goes to the real resolver.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import ssl
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import trustme

from criogenai import Dispatcher, Limits, ResultCache, Settings, ToolCall, ToolError, ToolRegistry
from criogenai.web import BraveSearch, SearxNG, WebPolicy, page_reader, read_page, web_search
from tests.web_sites import (
    ARTICLE,
    ARTICLE_SENTENCE,
    BOILERPLATE,
    Site,
    article,
    brave_results,
    endless,
    gzip_bomb,
    only_loopback,
    running,
    searx_results,
    slow,
)

__all__ = ["only_loopback"]  # the autouse guard, imported so that pytest applies it here

LOCAL = WebPolicy(allow_loopback=True, robots_txt=False)
"""What an application's tests set to read their own local servers."""

STUB = {
    "intranet.test": "10.0.0.5",
    "corp.test": "192.168.1.20",
    "linklocal.test": "169.254.10.10",
    "metadata.test": "169.254.169.254",
    "metadata6.test": "fd00:ec2::254",
    "mapped.test": "::ffff:127.0.0.1",
    "loopback.test": "127.0.0.1",
    "multicast.test": "224.0.0.251",
    "sitelocal.test": "fec0::1",
}


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names in ``STUB`` (and any the test adds) resolve to the addresses given; the rest as usual."""
    real = socket.getaddrinfo
    table: dict[str, list[str]] = {name: [addr] for name, addr in STUB.items()}
    asked: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in table:
            return real(host, port, *args, **kw)
        asked.append(name)
        answers = table[name]  # "rebind.test" answers its first address once, then the next
        answer = answers[min(len(asked), len(answers)) - 1] if name == "rebind.test" else answers[0]
        family = socket.AF_INET6 if ipaddress.ip_address(answer).version == 6 else socket.AF_INET
        sockaddr = (answer, port, 0, 0) if family == socket.AF_INET6 else (answer, port)
        return [(family, socket.SOCK_STREAM, 6, "", sockaddr)]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    table["__asked__"] = asked
    return table


@pytest.fixture
def site() -> Iterator[Site]:
    with running() as s:
        yield s


def reader(policy: WebPolicy = LOCAL) -> Any:
    return page_reader(policy)


def refused(policy: WebPolicy, url: str) -> str:
    with pytest.raises(ToolError) as info:
        reader(policy)(url)
    assert info.value.retryable is False
    return info.value.message


# -- reading pages ------------------------------------------------------------------------------


def test_an_article_comes_out_as_markdown_without_its_navigation_ads_and_footer(site: Site) -> None:
    url = site.page("/otters", ARTICLE)
    got = reader()(url)
    assert got["url"] == url and got["title"] == "The Otter Report" and got["content_type"] == "text/html"
    assert ARTICLE_SENTENCE in got["text"]
    assert "## Habitat" in got["text"] and "- Kelp forests" in got["text"]
    for junk in BOILERPLATE:
        assert junk not in got["text"]
    assert got["truncated"] is False


def test_plain_text_format_has_no_markdown_marks(site: Site) -> None:
    got = reader()(site.page("/otters", ARTICLE), format="text")
    assert ARTICLE_SENTENCE in got["text"]
    assert "## Habitat" not in got["text"] and "ADMARKER" not in got["text"]


@pytest.mark.parametrize(
    ("text", "encoding", "ctype", "meta"),
    [
        ("Café “crème” naïve", "windows-1252", "text/html; charset=windows-1252", ""),
        ("Café “crème” naïve", "windows-1252", "text/html; charset=ISO-8859-1", ""),  # WHATWG: means 1252
        ("Морские выдры используют камни", "koi8-r", "text/html", '<meta charset="koi8-r">'),
        ("ラッコは石を道具として使う", "shift_jis", "text/html",
         '<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS">'),
        ("Seeotter benützen Steine, große Überraschung", "utf-8", "text/html", ""),
    ],
    ids=["header-1252", "header-latin1-label", "meta-koi8r", "meta-http-equiv-sjis", "undeclared-utf8"],
)
def test_pages_are_decoded_by_their_charset(
    site: Site, text: str, encoding: str, ctype: str, meta: str
) -> None:
    html = article(text).replace("<head>", f"<head>{meta}")
    got = reader()(site.page("/p", html.encode(encoding), ctype))
    assert text in got["text"]


def test_plain_text_and_json_are_returned_as_text(site: Site) -> None:
    plain = reader()(site.page("/notes.txt", "line one\nZürich line two\n".encode("latin-1"),
                               "text/plain; charset=iso-8859-1"))
    assert plain["text"] == "line one\nZürich line two\n" and plain["title"] is None
    data = reader()(site.page("/api", b'{"otters": [1, 2], "name": "sea"}', "application/json"))
    assert data["content_type"] == "application/json"
    assert '"otters": [\n  1,\n  2\n ]' in data["text"] and '"name": "sea"' in data["text"]


def test_a_pdf_gives_its_text_and_title(site: Site) -> None:
    got = reader()(site.page("/paper.pdf", _pdf("Otters hold hands while sleeping"), "application/pdf"))
    assert "Otters hold hands while sleeping" in got["text"] and got["title"] == "Otter paper"


def test_other_content_types_are_refused_by_name(site: Site) -> None:
    with pytest.raises(ToolError, match="image/png"):
        reader()(site.page("/x.png", b"\x89PNG....", "image/png"))


def test_redirects_are_followed_and_the_final_url_is_given(site: Site) -> None:
    final = site.page("/final", ARTICLE)
    start = site.redirect("/a", "/b", 301)
    site.redirect("/b", final, 307)
    got = reader()(start)
    assert got["url"] == final and ARTICLE_SENTENCE in got["text"]
    assert site.paths() == ["/a", "/b", "/final"]


def test_a_redirect_loop_ends_with_an_error_naming_it(site: Site) -> None:
    site.redirect("/ping", "/pong")
    site.redirect("/pong", "/ping")
    with pytest.raises(ToolError, match="redirect loop"):
        reader()(site.url("/ping"))
    assert site.paths() == ["/ping", "/pong"]


def test_too_many_redirects_end_with_an_error(site: Site) -> None:
    for i in range(10):
        site.redirect(f"/r{i}", f"/r{i + 1}")
    with pytest.raises(ToolError, match="more than 3 redirects"):
        page_reader(WebPolicy(allow_loopback=True, robots_txt=False, max_redirects=3))(site.url("/r0"))
    assert len(site.hits) == 4


def test_a_50_mb_body_is_cut_at_the_cap(site: Site) -> None:
    site.routes["/huge"] = endless(50_000_000)
    started = time.monotonic()
    capped = WebPolicy(allow_loopback=True, robots_txt=False, max_bytes=1_000_000)
    got = page_reader(capped)(site.url("/huge"))
    assert got["truncated"] is True and len(got["text"]) == 1_000_000
    assert time.monotonic() - started < 10


def test_a_gzip_bomb_is_cut_at_the_cap_without_being_inflated(site: Site) -> None:
    route, wire_bytes = gzip_bomb(1 << 28)  # 256 MiB of zeros in about 250 KB
    site.routes["/bomb"] = route
    capped = WebPolicy(allow_loopback=True, robots_txt=False, max_bytes=2_000_000)
    tracemalloc.start()
    try:
        got = page_reader(capped)(site.url("/bomb"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got["truncated"] is True and len(got["text"]) == 2_000_000
    assert peak < 20_000_000, f"peak {peak} bytes for a {wire_bytes}-byte bomb"


def test_a_gzip_page_is_read(site: Site) -> None:
    import gzip

    site.page("/z", gzip.compress(ARTICLE.encode()), headers={"Content-Encoding": "gzip"})
    assert ARTICLE_SENTENCE in reader()(site.url("/z"))["text"]


def test_a_slow_server_times_out_and_the_error_may_be_retried(site: Site) -> None:
    site.routes["/slow"] = slow(site, 30)
    started = time.monotonic()
    with pytest.raises(ToolError, match="timed out") as info:
        page_reader(WebPolicy(allow_loopback=True, robots_txt=False, timeout_secs=0.5))(site.url("/slow"))
    assert info.value.retryable is True and time.monotonic() - started < 5


def test_server_errors_may_be_retried_and_missing_pages_not(site: Site) -> None:
    site.routes["/down"] = lambda h: h.reply(503, b"busy", "text/plain")
    with pytest.raises(ToolError, match="HTTP 503") as busy:
        reader()(site.url("/down"))
    with pytest.raises(ToolError, match="HTTP 404") as missing:
        reader()(site.url("/nope"))
    assert busy.value.retryable is True and missing.value.retryable is False


# -- robots.txt and the user agent --------------------------------------------------------------


def test_robots_txt_is_respected_by_default_and_can_be_turned_off(site: Site) -> None:
    site.page("/robots.txt", "User-agent: criogenai\nDisallow: /private/\n", "text/plain")
    site.page("/private/page", ARTICLE)
    site.page("/public", ARTICLE)
    polite = page_reader(WebPolicy(allow_loopback=True))
    with pytest.raises(ToolError, match=r"disallowed by the site's robots\.txt"):
        polite(site.url("/private/page"))
    assert ARTICLE_SENTENCE in polite(site.url("/public"))["text"]
    assert "/private/page" not in site.paths()
    assert ARTICLE_SENTENCE in reader()(site.url("/private/page"))["text"]  # robots_txt=False
    assert all(agent.startswith("criogenai/") for _, _, agent in site.hits)


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://127.0.0.1:70/",
                                 "/relative/path", "http://user:pw@127.0.0.1/"])
def test_urls_other_than_plain_http_and_https_are_refused(url: str) -> None:
    assert "refused" in refused(LOCAL, url) or "not a valid URL" in refused(LOCAL, url)


def test_a_redirect_to_loopback_is_refused_when_loopback_is_not_allowed() -> None:
    with running("127.0.0.2") as outside, running("127.0.0.1") as inside:
        inside.page("/admin", "secret admin page", "text/plain")
        outside.redirect("/go", inside.url("/admin"))
        # 127.0.0.2 stands in for a public server: the policy opens it explicitly, and nothing else.
        message = refused(WebPolicy(allow_networks=("127.0.0.2/32",), robots_txt=False), outside.url("/go"))
    assert message == "refused: 127.0.0.1 resolves to a loopback address, which this tool may not reach"
    assert outside.paths() == ["/go"] and inside.hits == []


@pytest.mark.parametrize(
    ("host", "kind"),
    [("intranet.test", "private"), ("corp.test", "private"), ("linklocal.test", "link-local"),
     ("metadata.test", "cloud metadata"), ("metadata6.test", "cloud metadata"),
     ("mapped.test", "loopback"), ("loopback.test", "loopback"), ("multicast.test", "multicast"),
     ("sitelocal.test", "site-local")],
)
def test_hostnames_resolving_to_internal_addresses_are_refused(resolver: Any, host: str, kind: str) -> None:
    message = refused(WebPolicy(robots_txt=False), f"http://{host}/latest/meta-data/")
    assert f"{host} resolves to a {kind} address" in message and STUB[host] not in message


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/",
                                 "http://[::ffff:169.254.169.254]/", "http://0.0.0.0:8080/", "http://[fec0::1]/",
                                 "http://2130706433/", "http://0x7f000001/", "http://127.1/"])
def test_address_literals_are_refused_like_names(url: str) -> None:
    assert "resolves to a" in refused(WebPolicy(robots_txt=False), url)


def test_metadata_addresses_stay_refused_even_inside_an_allowed_network(resolver: Any) -> None:
    policy = WebPolicy(allow_networks=("169.254.0.0/16", "fd00::/8"), robots_txt=False)
    assert "cloud metadata" in refused(policy, "http://metadata.test/")
    assert "cloud metadata" in refused(policy, "http://metadata6.test/")


def test_a_redirect_to_a_name_for_the_metadata_address_is_refused(resolver: Any, site: Site) -> None:
    start = site.redirect("/go", "http://metadata.test/latest/meta-data/iam/")
    assert "cloud metadata" in refused(LOCAL, start)


def test_the_default_read_page_refuses_loopback(site: Site) -> None:
    url = site.page("/otters", ARTICLE)
    with pytest.raises(ToolError, match="loopback address"):
        read_page(url)
    assert site.hits == []  # not even robots.txt


def test_the_allow_list_limits_reading_to_its_hosts(resolver: Any, site: Site) -> None:
    resolver["docs.test"] = ["127.0.0.1"]
    policy = WebPolicy(allow_hosts=("docs.test",), allow_loopback=True, robots_txt=False)
    site.page("/p", ARTICLE)
    assert ARTICLE_SENTENCE in page_reader(policy)(site.url("/p", host="docs.test"))["text"]
    assert "not on this tool's list" in refused(policy, site.url("/p"))
    start = site.redirect("/away", site.url("/p"))  # 127.0.0.1 by address: not an allowed host
    assert "not on this tool's list" in refused(policy, start.replace("127.0.0.1", "docs.test"))


def test_the_connection_goes_to_the_address_that_was_checked(resolver: Any) -> None:
    """DNS rebinding: the name answers an allowed address once, then an internal one. The fetch
    resolves once and connects to the address it checked, keeping the name in the Host header."""
    with running("127.0.0.2") as server:
        server.page("/p", ARTICLE)
        resolver["rebind.test"] = ["127.0.0.2", "10.0.0.5"]
        policy = WebPolicy(allow_networks=("127.0.0.2/32",), robots_txt=False)
        got = page_reader(policy)(server.url("/p", host="rebind.test"))
    assert ARTICLE_SENTENCE in got["text"]
    assert resolver["__asked__"] == ["rebind.test"]
    assert server.hits[0][1] == f"rebind.test:{server.port}"


def test_https_checks_the_certificate_and_sends_sni_for_the_name_while_connecting_to_the_checked_address(
    resolver: Any,
) -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("secure.test").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    resolver["secure.test"] = ["127.0.0.2"]
    policy = WebPolicy(allow_networks=("127.0.0.2/32",), robots_txt=False, ssl_context=client_tls)
    with running("127.0.0.2", tls=server_tls) as server:
        server.page("/p", ARTICLE)
        got = page_reader(policy)(server.url("/p", host="secure.test"))
        with pytest.raises(ToolError, match="could not read"):  # the certificate names secure.test only
            page_reader(policy)(server.url("/p"))
    assert ARTICLE_SENTENCE in got["text"] and got["url"].startswith("https://secure.test:")
    assert server.server_names[0] == "secure.test" and server.hits[0][1] == f"secure.test:{server.port}"


# -- results on the engine: cutting, full text, cache ---------------------------------------------


def test_a_long_page_is_cut_for_the_model_and_kept_whole_with_the_run(site: Site) -> None:
    long_text = "".join(f"Line {i} of a long plain text file about otters.\n" for i in range(5000))
    site.page("/long.txt", long_text, "text/plain")
    tool = page_reader(LOCAL)
    with Dispatcher([tool], settings=Settings(), limits=Limits(max_result_chars=2000)) as d:
        call = ToolCall(id="c1", name="read_page", arguments={"url": site.url("/long.txt")})
        [result] = d.run_turn_sync([call])
        assert result.status == "ok" and result.truncated and len(result.content) <= 2000
        assert result.content.startswith('{"url": ') and '"truncated": false' in result.content
        assert json.loads(d.fetch_full(result.run_id, "c1"))["text"] == long_text


def test_pages_are_cacheable_with_result_cache(site: Site) -> None:
    site.page("/otters", ARTICLE)
    cache = ResultCache(ttl_secs=60)
    call = ToolCall(id="c1", name="read_page", arguments={"url": site.url("/otters")})
    with Dispatcher([page_reader(LOCAL)], settings=Settings(), before_tool=[cache.before],
                    after_tool=[cache.after]) as d:
        first, second = d.run_turn_sync([call])[0], d.run_turn_sync([call])[0]
    assert first.status == second.status == "ok" and second.cached and second.content == first.content
    assert site.paths() == ["/otters"]


# -- search --------------------------------------------------------------------------------------


def test_searxng_results_come_as_title_url_and_snippet(site: Site) -> None:
    site.routes["/search"] = lambda h: h.reply(200, searx_results("otters"), "application/json")
    search = web_search(SearxNG(site.url("/")))
    got = search("sea otters", count=1)
    assert got == {"query": "sea otters", "results": [{
        "title": "Otter facts", "url": "https://otters.example/facts", "snippet": "Sea otters & their rocks",
    }]}
    path = site.paths()[0]
    assert path.startswith("/search?") and "format=json" in path and "q=sea+otters" in path


def test_brave_search_sends_its_key_in_a_header_only_and_never_returns_or_logs_it(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    key = "BSAk-secret-key-0123456789"
    seen: list[str | None] = []

    def route(h: Any) -> None:
        seen.append(h.headers.get("X-Subscription-Token"))
        h.reply(200, brave_results("otter"), "application/json")

    site.routes["/res/v1/web/search"] = route
    site.routes["/bad/web/search"] = lambda h: h.reply(401, f"bad token {key}".encode(), "text/plain")
    caplog.set_level(logging.DEBUG)
    provider = BraveSearch(key, base_url=site.url("/res/v1"))
    got = web_search(provider)("sea otter")
    assert got["results"] == [{"title": "Sea Otter - Wikipedia", "url": "https://wiki.example/Sea_otter",
                               "snippet": "The sea otter is a marine mammal"}]
    assert seen == [key] and key not in site.paths()[0]
    with pytest.raises(ToolError) as info:
        web_search(BraveSearch(key, base_url=site.url("/bad")))("otter")
    assert info.value.message == "Brave Search answered HTTP 401" and info.value.retryable is False
    assert key not in repr(provider) and key not in str(got) and key not in caplog.text


def test_search_results_with_escaped_lone_surrogates_or_deep_nesting_stay_data(site: Site) -> None:
    body = b'{"results": [{"title": "a\\ud800", "url": "https://x.example/\\udc80", "content": "s"}]}'
    site.routes["/search"] = lambda h: h.reply(200, body, "application/json")
    got = web_search(SearxNG(site.url("/")))("otters")
    assert got["results"] == [{"title": "a\\ud800", "url": "https://x.example/\\udc80", "snippet": "s"}]
    site.routes["/search"] = lambda h: h.reply(200, b"[" * 100_000 + b"]" * 100_000, "application/json")
    with pytest.raises(ToolError, match="SearxNG did not answer with JSON"):
        web_search(SearxNG(site.url("/")))("otters")


def test_a_search_provider_that_is_down_gives_a_retryable_error(site: Site) -> None:
    site.routes["/search"] = lambda h: h.reply(502, b"", "text/plain")
    with pytest.raises(ToolError, match="SearxNG answered HTTP 502") as info:
        web_search(SearxNG(site.url("/")))("otters")
    assert info.value.retryable is True


def test_the_readme_example_module_serves_the_web_tools() -> None:
    registry = ToolRegistry.from_modules(["examples.web_tools"])
    assert registry.names() == ["read_docs", "read_page", "web_search"]


@pytest.mark.timeout(90)  # unbounded, this file takes many minutes
def test_a_small_pdf_whose_pages_share_one_huge_stream_is_read_only_up_to_max_bytes(site: Site) -> None:
    # 60 pages drawing one 350 KB stream: a few KB on the wire, 20 MB of drawing to parse (minutes).
    bomb = _pdf("Otters " * 8, pages=60, repeat=4_000)
    one_page = len(f"BT /F1 12 Tf 72 720 Td ({'Otters ' * 8}) Tj ET\n") * 4_000
    policy = WebPolicy(allow_loopback=True, robots_txt=False, max_bytes=2 * one_page + 1)
    started = time.monotonic()
    got = reader(policy)(site.page("/bomb.pdf", bomb, "application/pdf"))

    assert len(bomb) < 50_000 and time.monotonic() - started < 30
    assert got["truncated"] is True and got["text"].count("\n\n") == 1  # two pages fit the budget
    with pytest.raises(ToolError, match="first page alone has over 100000 bytes"):
        reader(WebPolicy(allow_loopback=True, robots_txt=False, max_bytes=100_000))(site.url("/bomb.pdf"))


@pytest.mark.timeout(90)  # unbounded, this file takes minutes
def test_a_pdf_whose_pages_draw_one_huge_form_is_read_only_up_to_its_budget(site: Site) -> None:
    # 40 pages of a few bytes each, each drawing one 350 KB form: the form is read at every use
    bomb = _pdf("Otters " * 8, pages=40, repeat=4_000, form=True)
    one_page = len(f"BT /F1 12 Tf 72 720 Td ({'Otters ' * 8}) Tj ET\n") * 4_000
    policy = WebPolicy(allow_loopback=True, robots_txt=False, max_bytes=2 * one_page + 1)
    started = time.monotonic()
    got = reader(policy)(site.page("/forms.pdf", bomb, "application/pdf"))

    assert len(bomb) < 5_000 and time.monotonic() - started < 30
    assert got["truncated"] is True and 1 <= got["text"].count("\n\n") < 4


def test_a_json_page_with_escaped_lone_surrogates_or_deep_nesting_is_read_as_text(site: Site) -> None:
    escaped = reader()(site.page("/s.json", b'{"name": "a\\ud800b"}', "application/json"))
    assert escaped["text"] == '{\n "name": "a\\ud800b"\n}'
    json.dumps(escaped, ensure_ascii=False).encode()  # a result that can be filed
    deep = b"[" * 100_000 + b"]" * 100_000
    assert reader()(site.page("/deep.json", deep, "application/json"))["text"] == deep.decode()


def test_the_web_tools_are_read_only_so_retries_and_the_cache_apply() -> None:
    assert read_page.read_only and web_search(SearxNG("http://searx.invalid")).read_only
    assert read_page.schema["properties"]["url"]["maxLength"] == 2048


# -- helpers -------------------------------------------------------------------------------------


def _pdf(text: str, *, pages: int = 1, repeat: int = 1, form: bool = False) -> bytes:
    """A PDF whose page draws ``text`` (written by hand: pypdf reads but does not typeset): the
    drawing ``repeat`` times in one compressed stream, the page ``pages`` times (one object).
    ``form``: the stream is a form each page draws (``/Fm0 Do``), its own content a few bytes."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET\n".encode() * repeat
    packed = zlib.compress(stream, 9)
    kids = " ".join(["3 0 R"] * pages)
    drawing = b"/Filter /FlateDecode >>\nstream\n" + packed + b"\nendstream"
    page_content = b"q /Fm0 Do Q\n"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> /XObject << /Fm0 7 0 R >> >> >>",
        (b"<< /Length " + str(len(page_content)).encode() + b" >>\nstream\n" + page_content + b"\nendstream"
         if form else b"<< /Length " + str(len(packed)).encode() + b" " + drawing),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Title (Otter paper) >>",
        b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> "
        b"/Length " + str(len(packed)).encode() + b" " + drawing,
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info 6 0 R >>\n".encode()
    out += f"startxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)
