"""Go's `strconv.Quote` and kubelet's `FormatMap`, compared byte for byte with what Go prints."""

from __future__ import annotations

import unicodedata

import pytest

from fusevol.projection.goquote import (
    KNOWN_PYTHON_UNICODE_VERSIONS,
    format_map,
    go_quote,
    is_print,
    to_go_bytes,
)

QUOTES = [
    pytest.param("", '""', id="empty"),
    pytest.param("plain text 123", '"plain text 123"', id="ascii"),
    pytest.param('say "hi"', '"say \\"hi\\""', id="double-quote"),
    pytest.param("it's", '"it\'s"', id="single-quote-kept"),
    pytest.param("C:\\dir", '"C:\\\\dir"', id="backslash"),
    pytest.param("a\nb\tc\rd", '"a\\nb\\tc\\rd"', id="newline-tab-return"),
    pytest.param("\a\b\f\v", '"\\a\\b\\f\\v"', id="bell-backspace-formfeed-vtab"),
    pytest.param("\x00", '"\\x00"', id="nul"),
    pytest.param("\x1b[0m", '"\\x1b[0m"', id="escape"),
    pytest.param("\x7f", '"\\x7f"', id="delete"),
    pytest.param("\x80\x9f", '"\\u0080\\u009f"', id="c1-controls"),
    pytest.param("é", '"é"', id="latin-1-letter"),
    pytest.param("日本", '"日本"', id="cjk"),
    pytest.param("😀", '"😀"', id="emoji"),
    pytest.param("e\u0301", '"e\u0301"', id="combining-mark"),
    pytest.param("\u00a0", '"\\u00a0"', id="no-break-space"),
    pytest.param("\u00ad", '"\\u00ad"', id="soft-hyphen"),
    pytest.param("\u200b", '"\\u200b"', id="zero-width-space"),
    pytest.param("\u2028", '"\\u2028"', id="line-separator"),
    pytest.param("\u3000", '"\\u3000"', id="ideographic-space"),
    pytest.param("\ufeff", '"\\ufeff"', id="byte-order-mark"),
    pytest.param("\ue000", '"\\ue000"', id="private-use"),
    pytest.param("\U000e0001", '"\\U000e0001"', id="language-tag"),
    pytest.param("\U0010ffff", '"\\U0010ffff"', id="last-code-point"),
    pytest.param("\ufffd", '"\ufffd"', id="replacement-character-literal"),
    pytest.param("\U0001fae8", '"\U0001fae8"', id="unicode-15-emoji"),
    pytest.param("\U00031350", '"\U00031350"', id="unicode-15-cjk-extension-h"),
    pytest.param("\u2ffc", '"\\u2ffc"', id="unicode-15-1-not-yet-in-go"),
    pytest.param(b"\xff\xfe", '"\\xff\\xfe"', id="invalid-utf8"),
    pytest.param(b"a\xe6\x97", '"a\\xe6\\x97"', id="truncated-sequence"),
    pytest.param(b"\xe6\x97\xa5\xe6", '"日\\xe6"', id="valid-then-truncated"),
    pytest.param(b"\xed\xa0\x80", '"\\xed\\xa0\\x80"', id="encoded-surrogate"),
    pytest.param(b"\xc0\x80", '"\\xc0\\x80"', id="overlong-nul"),
    pytest.param(b"\xf4\x90\x80\x80", '"\\xf4\\x90\\x80\\x80"', id="beyond-10ffff"),
    pytest.param(b"\xef\xbf\xbd", '"\ufffd"', id="replacement-character-bytes"),
    pytest.param("\udcff\udc80", '"\\xff\\x80"', id="surrogateescape-str"),
    pytest.param("\ud800", '"\ufffd"', id="other-lone-surrogate"),
]


@pytest.mark.parametrize(("value", "expected"), QUOTES)
def test_go_quote(value: str | bytes, expected: str) -> None:
    assert go_quote(value) == expected


FORMAT_MAPS = [
    pytest.param({}, "", id="empty"),
    pytest.param({"app": "web"}, 'app="web"', id="one"),
    pytest.param(
        {"b": "2", "a": "1", "B": "3", "é": "4", "a.b/c": ""},
        'B="3"\na="1"\na.b/c=""\nb="2"\né="4"',
        id="byte-order-no-trailing-newline",
    ),
    pytest.param(
        {"note": 'line1\nline2 "q" \\ é\u00a0'},
        'note="line1\\nline2 \\"q\\" \\\\ é\\u00a0"',
        id="value-quoted",
    ),
    pytest.param({"\uffff": "x", "\U00010000": "y"}, '\uffff="x"\n\U00010000="y"', id="utf8-order"),
]


@pytest.mark.parametrize(("mapping", "expected"), FORMAT_MAPS)
def test_format_map(mapping: dict[str, str], expected: str) -> None:
    assert format_map(mapping) == expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        pytest.param(0x20, True, id="space"),
        pytest.param(0x7E, True, id="tilde"),
        pytest.param(0xA0, False, id="no-break-space"),
        pytest.param(0xA1, True, id="inverted-exclamation"),
        pytest.param(0xAD, False, id="soft-hyphen"),
        pytest.param(0x2028, False, id="line-separator"),
        pytest.param(0x0CF3, True, id="unicode-15-kannada"),
        pytest.param(0x2EBF0, False, id="unicode-15-1-cjk-extension-i"),
        pytest.param(0xD800, False, id="surrogate"),
    ],
)
def test_is_print(code: int, expected: bool) -> None:
    assert is_print(code) is expected


def test_to_go_bytes() -> None:
    assert to_go_bytes("h\u00e9\udcff") == b"h\xc3\xa9\xff"


def test_python_unicode_version_is_one_go_quote_corrects() -> None:
    # A new Python brings a Unicode version whose additions Go (15.0.0) does not know yet:
    # add its delta to goquote's tables before trusting go_quote on it.
    assert unicodedata.unidata_version in KNOWN_PYTHON_UNICODE_VERSIONS
