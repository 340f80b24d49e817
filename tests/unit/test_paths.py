"""AtomicWriter path rules, Go's filepath.Clean, and the API-side key and path rules."""

from __future__ import annotations

import posixpath

import pytest

from fusevol.base.errors import InvalidPayload
from fusevol.model import FileProjection
from fusevol.projection.paths import (
    clean_path,
    validate_path,
    validate_payload,
)


def long_path(size: int) -> str:
    """A path of exactly `size` UTF-8 bytes whose names are all within 255 bytes."""
    chunk = "x" * 254 + "/"
    path = chunk * (size // len(chunk))
    rest = size - len(path)
    return path + "y" * rest if rest else path[:-1] + "z"


def test_long_path_helper() -> None:
    for size in (255, 256, 4096, 4097):
        path = long_path(size)
        assert len(path.encode()) == size
        assert max(len(name) for name in path.split("/")) <= 255


CLEAN_CASES = [
    pytest.param("foo////bar", "foo/bar", id="repeated-slashes"),
    pytest.param("./bar", "bar", id="leading-dot"),
    pytest.param("a/../b", "b", id="dotdot-cancels"),
    pytest.param("a/./b/.", "a/b", id="inner-dots"),
    pytest.param("a/b/", "a/b", id="trailing-slash"),
    pytest.param("", ".", id="empty"),
    pytest.param(".", ".", id="dot"),
    pytest.param("./", ".", id="dot-slash"),
    pytest.param("a/..", ".", id="everything-cancels"),
    pytest.param("..", "..", id="dotdot"),
    pytest.param("../a", "../a", id="leading-dotdot-kept"),
    pytest.param("a/../..", "..", id="dotdot-past-start"),
    pytest.param("../../a/../b", "../../b", id="dotdots-stack"),
    pytest.param("/", "/", id="root"),
    pytest.param("/../a", "/a", id="rooted-dotdot-dropped"),
    pytest.param("//a", "/a", id="double-slash-root"),
    pytest.param("/a/b/..", "/a", id="rooted"),
    pytest.param("./..data", "..data", id="dot-then-reserved"),
    pytest.param(".hidden/./x", ".hidden/x", id="dotfile"),
]


@pytest.mark.parametrize(("path", "expected"), CLEAN_CASES)
def test_clean_path(path: str, expected: str) -> None:
    assert clean_path(path) == expected


@pytest.mark.parametrize("path", [p.values[0] for p in CLEAN_CASES if p.id != "double-slash-root"])
def test_clean_path_agrees_with_normpath(path: str) -> None:
    # posixpath keeps a leading "//" (POSIX allows it a meaning); Go does not, hence the exclusion.
    assert clean_path(path) == posixpath.normpath(path)


VALID_PATHS = [
    pytest.param("i/am/well/behaved.txt", id="kubelet-valid-1"),
    pytest.param("keepyourheaddown.txt", id="kubelet-valid-2"),
    pytest.param(".dotfile", id="dotfile"),
    pytest.param("dir/.dotfile", id="nested-dotfile"),
    pytest.param("a/..b", id="inner-name-starting-with-dotdot"),
    pytest.param("a/...", id="inner-triple-dot"),
    pytest.param("x..y", id="dotdot-inside-name"),
    pytest.param("a..", id="dotdot-at-end"),
    pytest.param("./bar", id="leading-dot-element"),
    pytest.param("foo////bar", id="repeated-slashes"),
    pytest.param("a/b/", id="trailing-slash"),
    pytest.param("n" * 255, id="name-255-bytes"),
    pytest.param("é" * 127 + "a", id="name-255-utf8-bytes"),
    pytest.param(f"d/{'n' * 255}", id="nested-name-255-bytes"),
    pytest.param(long_path(4096), id="path-4096-bytes"),
]


@pytest.mark.parametrize("path", VALID_PATHS)
def test_validate_path_accepts(path: str) -> None:
    validate_path(path)
    assert validate_payload({path: FileProjection(data=b"", mode=0o644)}) == {
        clean_path(path): FileProjection(data=b"", mode=0o644)
    }


INVALID_PATHS = [
    pytest.param("", r'invalid path "": must not be empty', id="empty"),
    pytest.param("/dev/null", r'"/dev/null": must be a relative path', id="kubelet-absolute"),
    pytest.param("/", r'"/": must be a relative path', id="root"),
    pytest.param("..", r"\"\.\.\": must not contain '\.\.'", id="dotdot"),
    pytest.param("../x", r"invalid path \"\.\./x\": must not contain '\.\.'", id="leading-dotdot"),
    pytest.param("a/..", r"must not contain '\.\.'", id="trailing-dotdot"),
    pytest.param("foo/../bar", r"must not contain '\.\.'", id="inner-dotdot"),
    pytest.param(
        "hello/there/../../../../../../etc/passwd", r"must not contain '\.\.'", id="kubelet-escape"
    ),
    pytest.param("hello/../etc/somethingbad", r"must not contain '\.\.'", id="kubelet-dotdot-2"),
    pytest.param("..sneaky.txt", r"\"\.\.sneaky\.txt\": must not start with '\.\.'", id="sneaky"),
    pytest.param("..data", r"must not start with '\.\.'", id="data-link"),
    pytest.param("..data/x", r"must not start with '\.\.'", id="under-data-link"),
    pytest.param("...", r"must not start with '\.\.'", id="triple-dot"),
    pytest.param("..2024_01_31_12_34_56.1", r"must not start with '\.\.'", id="timestamp-dir"),
    pytest.param("n" * 256, r"file names must be no more than 255 bytes, not 256", id="name-256"),
    pytest.param("é" * 128, r"no more than 255 bytes, not 256", id="name-256-utf8-bytes"),
    pytest.param(f"d/{'n' * 256}/f", r"no more than 255 bytes", id="nested-name-256"),
    pytest.param(long_path(4097), r"no more than 4096 bytes, not 4097", id="path-4097"),
    pytest.param(
        "é/" * 1365 + "é", r"no more than 4096 bytes, not 4097", id="path-4097-utf8-bytes"
    ),
    pytest.param("a\0b", r"must not contain NUL", id="nul"),
    pytest.param("a\udcffb", r"must be valid UTF-8", id="lone-surrogate"),
]


@pytest.mark.parametrize(("path", "message"), INVALID_PATHS)
def test_validate_path_rejects(path: str, message: str) -> None:
    with pytest.raises(InvalidPayload, match=message):
        validate_path(path)


def test_long_path_message_is_shortened() -> None:
    with pytest.raises(InvalidPayload) as info:
        validate_path(long_path(4097))
    assert len(str(info.value)) < 200
    assert "(4097 bytes)" in str(info.value)


def file(data: bytes) -> FileProjection:
    return FileProjection(data=data, mode=0o644)


def test_validate_payload_cleans_paths() -> None:
    payload = {"foo////bar": file(b"1"), "./baz": file(b"2"), "a/./b/": file(b"3")}
    cleaned = validate_payload(payload)
    assert cleaned == {"foo/bar": file(b"1"), "baz": file(b"2"), "a/b": file(b"3")}
    assert list(cleaned) == ["foo/bar", "baz", "a/b"]
    assert "foo////bar" in payload  # the input is left alone


def test_validate_payload_last_wins_among_paths_cleaning_alike() -> None:
    assert validate_payload({"a//b": file(b"1"), "a/b": file(b"2")}) == {"a/b": file(b"2")}


def test_validate_payload_empty() -> None:
    assert validate_payload({}) == {}


INVALID_PAYLOADS = [
    pytest.param(
        {"good": file(b"1"), "../bad": file(b"2")}, r"\"\.\./bad\"", id="one-bad-path-aborts-all"
    ),
    pytest.param(
        {"a": file(b"1"), "a/b": file(b"2")},
        r'"a" is a file, but "a/b" needs it to be a directory',
        id="file-then-child",
    ),
    pytest.param(
        {"a/b/c": file(b"1"), "a/b": file(b"2")},
        r'"a/b" is a file, but "a/b/c" needs it to be a directory',
        id="child-then-file",
    ),
    pytest.param(
        {"./a": file(b"1"), "a//b": file(b"2")},
        r'"a" is a file, but "a/b" needs',
        id="conflict-after-cleaning",
    ),
    pytest.param({"./": file(b"1")}, r'"\./": names the volume directory', id="cleans-to-dot"),
    pytest.param({"a/": file(b"1"), "./": file(b"2")}, r"volume directory", id="dot-among-others"),
    pytest.param(
        {"./..data": file(b"1")},
        r"must not start with '\.\.' once cleaned to \"\.\.data\"",
        id="reserved-after-cleaning",
    ),
]


@pytest.mark.parametrize(("payload", "message"), INVALID_PAYLOADS)
def test_validate_payload_rejects(payload: dict[str, FileProjection], message: str) -> None:
    with pytest.raises(InvalidPayload, match=message):
        validate_payload(payload)


@pytest.mark.parametrize(
    "paths",
    [
        pytest.param(["a/b", "a/c", "a/d/e"], id="siblings"),
        pytest.param(["a", "ab/c", "a.b/c"], id="shared-string-prefix-only"),
        pytest.param(["x/a", "y/a/b"], id="same-name-elsewhere"),
    ],
)
def test_validate_payload_allows_shared_directories(paths: list[str]) -> None:
    assert set(validate_payload({path: file(b"") for path in paths})) == set(paths)
