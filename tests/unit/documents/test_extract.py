"""A document's text: every kind the library takes, where each passage is from, and files it must refuse clearly."""

from __future__ import annotations

import pytest

from backend.documents.extract import extract
from backend.documents.passages import passages
from backend.documents.terms import query_terms, terms
from backend.errors import DocumentError
from tests.document_files import docx_bytes, pdf_bytes


def test_pdf_pages_keep_their_numbers() -> None:
    found = extract("a.pdf", pdf_bytes(["The first page.", "", "The third page (with brackets)."]))
    assert [(s.page, s.text) for s in found] == [(1, "The first page."), (3, "The third page (with brackets).")]


def test_a_pdf_without_a_text_layer_is_refused_in_both_languages() -> None:
    with pytest.raises(DocumentError) as caught:
        extract("scan.pdf", pdf_bytes(["", ""]))
    assert caught.value.code == "documents.pdf_no_text"
    assert "no text layer" in caught.value.text("en") and "OCR" in caught.value.text("en")
    assert "没有文字层" in caught.value.text("zh-CN")


def test_word_headings_html_headings_and_markdown_headings_name_sections() -> None:
    docx = extract(
        "a.docx", docx_bytes([("Heading1", "Safety"), (None, "Wear boots."), ("Title", "二"), (None, "文字")])
    )
    assert [(s.heading, s.text) for s in docx] == [("Safety", "Wear boots."), ("二", "文字")]
    page = (
        b"<html><head><script>var leak = 1</script><style>p{}</style></head><body><h2>Hours</h2><p>9 &amp; 5</p></body>"
    )
    assert [(s.heading, s.text) for s in extract("a.html", page)] == [("Hours", "9 & 5")]
    md = extract("a.md", b"# Top\nintro\n```\n# not a heading\n```\n## Next\nmore")
    assert [s.heading for s in md] == ["Top", "Next"] and "# not a heading" in md[0].text


def test_text_in_chinese_encodings_is_read() -> None:
    assert extract("a.txt", "青石镇茶叶".encode("gb18030"))[0].text == "青石镇茶叶"
    assert extract("a.txt", "青石镇".encode("utf-16"))[0].text == "青石镇"


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("photo.png", b"\x89PNG", "documents.bad_type"),
        ("empty.txt", b"  \n\n ", "documents.no_text"),
        ("broken.docx", b"not a zip", "documents.unreadable"),
        ("broken.pdf", b"%PDF-1.4 nothing", "documents.unreadable"),
    ],
)
def test_files_the_library_cannot_take_are_refused_with_a_reason(name: str, data: bytes, code: str) -> None:
    with pytest.raises(DocumentError) as caught:
        extract(name, data)
    assert caught.value.code == code and caught.value.text("zh-CN") != caught.value.text("en")


def test_passages_end_at_sentences_and_carry_their_heading() -> None:
    text = " ".join(f"Sentence number {n} ends here." for n in range(60))
    found = passages(extract("a.md", f"# Rules\n{text}".encode()), 300)
    assert len(found) > 3 and all(p.heading == "Rules" and p.text.startswith("Rules\n") for p in found)
    assert all(len(p.text) <= 300 + len("Rules\n") and p.text.endswith(".") for p in found)
    assert " ".join(p.text.removeprefix("Rules\n") for p in found) == text


def test_terms_are_words_and_pairs_of_chinese_characters() -> None:
    assert terms("Kestrel 4.2's Grid") == ["kestrel", "4", "2", "s", "grid"]
    assert terms("理事长是谁") == ["理事", "事长", "长是", "是谁"]
    assert query_terms("茶 tea tea") == ["茶", "tea"]
