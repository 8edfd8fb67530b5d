"""Documents to passages: text, Markdown or HTML becomes plain text cut into search-sized chunks.

Markdown is parsed with markdown-it-py and HTML with the standard library's parser (scripts,
styles and markup dropped). A chunk never spans two sections: each starts with the heading of its
section, so a passage found alone still says what it is about. Paragraphs are packed up to
``chunk_chars``; a longer paragraph is cut at sentence ends, then at spaces.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Literal

Format = Literal["text", "markdown", "html"]
DEFAULT_CHUNK_CHARS = 1000

Section = tuple[str, list[str]]
"""A heading (or "") and the paragraphs under it."""


def sections(text: str, fmt: Format) -> list[Section]:
    """The document's sections of plain-text paragraphs."""
    if fmt == "markdown":
        return _markdown(text)
    if fmt == "html":
        parser = _Html()
        parser.feed(text)
        parser.close()
        return parser.done()
    if fmt == "text":
        return [("", [p for p in re.split(r"\n\s*\n", text) if p.strip()])]
    raise ValueError(f"format must be 'text', 'markdown' or 'html', not {fmt!r}")


def chunk(text: str, fmt: Format = "text", chunk_chars: int = DEFAULT_CHUNK_CHARS) -> list[str]:
    """``text`` as passages of at most about ``chunk_chars`` characters, in document order."""
    out: list[str] = []
    for heading, paragraphs in sections(text.replace("\x00", ""), fmt):
        head = _squash(heading)
        room = max(chunk_chars - len(head) - 2, chunk_chars // 2)
        pieces = [p for para in paragraphs for p in _cut(_squash(para), room) if p]
        current = ""
        for piece in pieces:
            if current and len(current) + 1 + len(piece) > room:
                out.append(f"{head}\n\n{current}" if head else current)
                current = piece
            else:
                current = f"{current}\n{piece}" if current else piece
        if current:
            out.append(f"{head}\n\n{current}" if head else current)
        elif head and not pieces:
            out.append(head)
    return out


def _squash(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, room: int) -> list[str]:
    """One paragraph as pieces of at most ``room`` characters: at sentence ends, else spaces."""
    if len(text) <= room:
        return [text]
    out: list[str] = []
    current = ""
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        while len(sentence) > room:
            cut = sentence.rfind(" ", 0, room)
            cut = cut if cut > room // 2 else room
            if current:
                out.append(current)
                current = ""
            out.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if current and len(current) + 1 + len(sentence) > room:
            out.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}" if current else sentence
    if current:
        out.append(current)
    return out


def _markdown(text: str) -> list[Section]:
    from markdown_it import MarkdownIt  # here, not with criogenai: only markdown documents need it

    result: list[Section] = [("", [])]
    tokens = MarkdownIt("commonmark").parse(text)
    heading_open = False
    for tok in tokens:
        if tok.type == "heading_open":
            heading_open = True
        elif tok.type == "heading_close":
            heading_open = False
        elif tok.type == "inline":
            plain = "".join(c.content for c in (tok.children or []) if c.type in ("text", "code_inline"))
            if heading_open:
                result.append((plain, []))
            else:
                result[-1][1].append(plain)
        elif tok.type in ("fence", "code_block"):
            result[-1][1].append(tok.content)
    return [s for s in result if s[0] or s[1]]


class _Html(HTMLParser):
    """Text of an HTML page by block, with headings starting sections."""

    _SKIP = frozenset({"script", "style", "head", "template", "noscript", "svg"})
    _HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
    _BLOCKS = frozenset({"p", "div", "li", "tr", "br", "section", "article", "pre", "blockquote",
                         "table", "ul", "ol", "dd", "dt", "main", "header", "footer", "td", "th"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._sections: list[Section] = [("", [])]
        self._buffer: list[str] = []
        self._skipping = 0
        self._in_heading = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._HEADINGS or tag in self._BLOCKS:
            self._flush()
            self._in_heading = tag in self._HEADINGS

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self._HEADINGS or tag in self._BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._buffer.append(data)

    def _flush(self) -> None:
        text = _squash("".join(self._buffer))
        self._buffer = []
        if text:
            if self._in_heading:
                self._sections.append((text, []))
            else:
                self._sections[-1][1].append(text)
        self._in_heading = False

    def done(self) -> list[Section]:
        self._flush()
        return [s for s in self._sections if s[0] or s[1]]
