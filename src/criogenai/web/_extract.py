"""A fetched body as text for a model: HTML's main text (trafilatura), plain text, JSON, PDF.

trafilatura rather than readability plus a Markdown converter: it writes Markdown (or plain text)
itself, keeps headings, lists and tables, drops navigation, ads and footers, falls back on
readability and jusText internally when its own heuristics find little, is maintained, and leads
the published main-text extraction benchmarks; one library instead of two.
"""

from __future__ import annotations

import codecs
import io
import json
import re
from typing import Any, Literal

import charset_normalizer
import trafilatura

from .._errors import ToolError
from ..tools._content import plain
from ._fetch import Fetched

Format = Literal["markdown", "text"]

_HTML = ("text/html", "application/xhtml+xml")
_TEXT = ("text/plain", "text/markdown", "text/csv", "text/xml", "application/xml")
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.I)
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# WHATWG: these labels mean windows-1252 on the web (0x80-0x9F are curly quotes, not controls).
_AS_CP1252 = {"iso8859-1", "latin-1", "ascii", "cp1252"}


def page(fetched: Fetched, fmt: Format, max_pdf_content: int) -> dict[str, Any]:
    """What the model gets: the final URL, a title when there is one, the text, and whether the
    body was cut at the policy's byte cap (or a PDF's pages at ``max_pdf_content``)."""
    kind = fetched.content_type or _sniff(fetched.body)
    title: str | None = None
    truncated = fetched.truncated
    if kind in _HTML:
        html = decode(fetched.body, fetched.charset, html=True)
        title, text = _html(html, fetched.url, fmt)
    elif kind == "application/json" or kind.endswith("+json"):
        text = _json(decode(fetched.body, fetched.charset or "utf-8", html=False))
    elif kind == "application/pdf":
        if fetched.truncated:
            raise ToolError(f"{fetched.url} is a PDF larger than this tool reads ({len(fetched.body)} bytes)")
        title, text, truncated = _pdf(fetched.body, max_pdf_content)
    elif kind.startswith("text/") or kind in _TEXT:
        text = decode(fetched.body, fetched.charset, html=False)
    else:
        raise ToolError(f"{fetched.url} is {kind}, which this tool cannot read as text")
    return {
        "url": fetched.url,
        "title": title,
        "content_type": kind,
        "truncated": truncated,
        "text": text,  # last, so that a result cut for the model keeps every other field
    }


def decode(body: bytes, declared: str | None, *, html: bool) -> str:
    """Text from bytes, the charset taken from (in order) a BOM, the HTTP header, an HTML
    ``<meta>`` in the first 4 KB, strict UTF-8, then charset-normalizer's guess."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body.decode(name, errors="replace")
    candidates = [declared]
    if html:
        found = _META_CHARSET.search(body[:4096])
        candidates.append(found.group(1).decode("ascii") if found else None)
    for label in candidates:
        codec = _codec(label)
        if codec is not None:
            return body.decode(codec, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    best = charset_normalizer.from_bytes(body[:200_000]).best()
    return body.decode(best.encoding if best else "utf-8", errors="replace")


def _codec(label: str | None) -> str | None:
    if not label:
        return None
    try:
        name = codecs.lookup(label.strip().strip("\"'")).name
    except LookupError:
        return None
    return "cp1252" if name in _AS_CP1252 else name


def _sniff(body: bytes) -> str:
    head = body[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "text/html"
    if head.startswith(b"%pdf-"):
        return "application/pdf"
    return "text/plain"


def _html(html: str, url: str, fmt: Format) -> tuple[str | None, str]:
    output = "markdown" if fmt == "markdown" else "txt"
    text = trafilatura.extract(html, url=url, output_format=output, include_tables=True,
                               include_links=fmt == "markdown", deduplicate=True)
    if not text:
        # No main text found (an index page, a form): all visible text beats nothing.
        text = trafilatura.html2txt(html) or ""
    meta = trafilatura.extract_metadata(html, default_url=url)
    title = meta.title if meta is not None and meta.title else None
    return title, text


def _json(text: str) -> str:
    try:  # plain: a "\\ud800" escape in the page stays an escape, not a lone surrogate
        return plain(json.dumps(json.loads(text), indent=1, ensure_ascii=False))
    except (ValueError, RecursionError):
        return text  # cut at the byte cap, not JSON after all, or nested too deep: read as text


_BYTES_PER_OPERATOR = 16
"""The operator budget of a PDF's text is ``max_bytes`` over this: about what a page of text costs
per operator, so a document of forms gets the work its content streams' bytes would."""


class _Spent(Exception):
    """The document drew more operators than its budget."""


class _OperatorBudget:
    """Counts the drawing operators text extraction reads, across the whole document: the forms a
    page draws (``Do``) are read again at every use, so a small file of pages drawing one huge
    form, or one form thousands of times, costs far more than its content streams' size."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def __call__(self, *_: Any) -> None:
        self.used += 1
        if self.used > self.limit:
            # Raised again at each later operator: pypdf logs and goes on past an error in a form,
            # and the page's next operator then ends its extraction.
            raise _Spent


def _pdf(body: bytes, max_content: int) -> tuple[str | None, str, bool]:
    """The PDF's title and text, and whether pages were left out: pages are read until their
    inflated content streams add up to ``max_content`` bytes (the policy's ``max_bytes``)."""
    try:
        import pypdf
    except ImportError:
        raise ToolError("this tool cannot read PDF files (pypdf is not installed)") from None
    texts: list[str] = []
    spent, cut = 0, False
    operators = _OperatorBudget(max_content // _BYTES_PER_OPERATOR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(body))
        for p in reader.pages:
            # A page's content stream costs its inflated size to read, and a small file can have
            # many pages sharing one huge stream: read pages while their content fits the budget.
            contents = p.get_contents()
            spent += len(contents.get_data()) if contents is not None else 0
            if spent > max_content and texts:
                cut = True
                break
            if spent > max_content:
                raise ToolError(f"the PDF's first page alone has over {max_content} bytes of content")
            try:
                texts.append(p.extract_text(visitor_operand_before=operators) or "")
            except _Spent:
                cut = True
                break
        if not texts and cut:
            raise ToolError(f"the PDF's first page alone draws over {operators.limit} operators")
        title = reader.metadata.title if reader.metadata is not None else None
    except ToolError:
        raise
    except Exception as exc:  # pypdf raises many types on a broken file
        raise ToolError(f"the PDF could not be read: {type(exc).__name__}") from None
    return (str(title) if title else None), plain("\n\n".join(texts)), cut
