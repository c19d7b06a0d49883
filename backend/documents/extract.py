"""A document's text, as sections that keep where they came from (page, heading): plain text, Markdown, HTML, PDF
and Word (.docx). Everything here reads bytes already in memory and never fetches anything (an HTML page's links and
images, a PDF's or a Word file's external parts are not followed).

A file that holds no text (a scanned PDF without a text layer, an empty file) raises DocumentError with what to do,
so the library never keeps a document it cannot search."""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath
from xml.etree import ElementTree

from pypdf import PdfReader
from pypdf.errors import PdfReadError

from backend.errors import DocumentError

# The kinds of file the library takes: file name suffix -> (kind, the MIME types a browser sends for it).
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    ".txt": ("text", ("text/plain",)),
    ".md": ("markdown", ("text/markdown", "text/x-markdown", "text/plain")),
    ".markdown": ("markdown", ("text/markdown", "text/x-markdown", "text/plain")),
    ".html": ("html", ("text/html",)),
    ".htm": ("html", ("text/html",)),
    ".pdf": ("pdf", ("application/pdf",)),
    ".docx": ("docx", ("application/vnd.openxmlformats-officedocument.wordprocessingml.document",)),
}
MAX_DOCX_XML_BYTES = 64 * 1024 * 1024  # a .docx whose document.xml unpacks larger is refused (a zip bomb)
_MD_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
_BLANK_RUNS = re.compile(r"\n{3,}")
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


@dataclass(frozen=True)
class Section:
    """A run of a document's text under one heading, or on one page (a PDF's)."""

    text: str
    page: int | None = None  # 1-based (PDF)
    heading: str | None = None


def kind_of(name: str) -> str | None:
    """The kind of a file by its name's suffix (one of KINDS), or None for a kind the library does not take."""
    found = KINDS.get(PurePath(name).suffix.lower())
    return found[0] if found else None


def accepted_types() -> dict[str, list[str]]:
    """MIME type -> file name suffixes, as Chainlit's `accept` setting takes them (the upload button's filter)."""
    accept: dict[str, list[str]] = {}
    for suffix, (_, mimes) in KINDS.items():
        for mime in mimes:
            accept.setdefault(mime, []).append(suffix)
    return accept


def decode_text(data: bytes) -> str:
    """Text bytes as str: UTF-8 (with or without BOM), UTF-16 with a BOM, else GB18030 (Chinese Windows files)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("gb18030")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return _BLANK_RUNS.sub("\n\n", "\n".join(line.rstrip() for line in text.split("\n"))).strip()


def markdown_sections(text: str) -> list[Section]:
    """Markdown (or plain text) cut at its headings (# lines); fenced code stays with its heading."""
    sections: list[Section] = []
    heading: str | None = None
    lines: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        found = None if fenced else _MD_HEADING.match(line)
        if found:
            if body := _clean("\n".join(lines)):
                sections.append(Section(body, heading=heading))
            heading, lines = found.group(2).strip(), []
        else:
            lines.append(line)
    if body := _clean("\n".join(lines)):
        sections.append(Section(body, heading=heading))
    return sections


class _HtmlText(HTMLParser):
    """An HTML page's visible text, cut at its headings (h1-h6); scripts, styles and templates left out."""

    SKIP = frozenset({"script", "style", "template", "noscript", "head", "svg"})
    BLOCKS = frozenset({"p", "div", "li", "tr", "br", "section", "article", "pre", "blockquote", "table", "ul", "ol"})
    HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.heading: str | None = None
        self.parts: list[str] = []
        self.title: list[str] = []
        self.skipping = 0
        self.in_heading = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.HEADINGS:
            self._close()
            self.in_heading, self.title = True, []
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.HEADINGS and self.in_heading:
            self.in_heading = False
            self.heading = " ".join("".join(self.title).split()) or None
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        (self.title if self.in_heading else self.parts).append(data)

    def _close(self) -> None:
        text = "\n".join(" ".join(line.split()) for line in "".join(self.parts).split("\n"))
        if body := _clean(text):
            self.sections.append(Section(body, heading=self.heading))
        self.parts = []

    def result(self) -> list[Section]:
        self._close()
        return self.sections


def html_sections(text: str) -> list[Section]:
    parser = _HtmlText()
    parser.feed(text)
    parser.close()
    return parser.result()


def pdf_sections(data: bytes) -> list[Section]:
    """A PDF's text layer, one section per page; DocumentError for a PDF that cannot be read or has no text."""
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentError.of("documents.pdf_encrypted")
        pages = [_clean(page.extract_text() or "") for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise DocumentError.of("documents.unreadable", detail=str(exc) or type(exc).__name__) from exc
    sections = [Section(text, page=n) for n, text in enumerate(pages, 1) if text]
    if not sections:
        raise DocumentError.of("documents.pdf_no_text", pages=len(pages))
    return sections


def docx_sections(data: bytes) -> list[Section]:
    """A Word file's paragraphs (word/document.xml), cut at its headings (the Heading and Title styles)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            info = archive.getinfo("word/document.xml")
            if info.file_size > MAX_DOCX_XML_BYTES:
                raise DocumentError.of("documents.unreadable", detail="word/document.xml is too large")
            root = ElementTree.fromstring(archive.read(info))
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, OSError) as exc:
        raise DocumentError.of("documents.unreadable", detail=str(exc) or type(exc).__name__) from exc
    sections: list[Section] = []
    heading: str | None = None
    lines: list[str] = []
    for paragraph in root.iter(f"{_W}p"):
        style = paragraph.find(f"{_W}pPr/{_W}pStyle")
        name = (style.get(f"{_W}val") or "") if style is not None else ""
        text = "".join(
            node.text or "" if node.tag == f"{_W}t" else ("\t" if node.tag == f"{_W}tab" else "\n")
            for node in paragraph.iter()
            if node.tag in (f"{_W}t", f"{_W}tab", f"{_W}br")
        ).strip()
        if name.lower().startswith(("heading", "title")) and text:
            if body := _clean("\n".join(lines)):
                sections.append(Section(body, heading=heading))
            heading, lines = text, []
        elif text:
            lines.append(text)
    if body := _clean("\n".join(lines)):
        sections.append(Section(body, heading=heading))
    return sections


def extract(name: str, data: bytes) -> list[Section]:
    """The text of the file `name` (its bytes `data`) as sections; DocumentError for a kind the library does not
    take, a file it cannot read, or one without text."""
    kind = kind_of(name)
    if kind is None:
        raise DocumentError.of("documents.bad_type", name=name, kinds=", ".join(KINDS))
    if kind == "pdf":
        sections = pdf_sections(data)
    elif kind == "docx":
        sections = docx_sections(data)
    elif kind == "html":
        sections = html_sections(decode_text(data))
    else:
        sections = markdown_sections(_clean(decode_text(data)))
    if not sections:
        raise DocumentError.of("documents.no_text", name=name)
    return sections
