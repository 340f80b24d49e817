"""A large LIST answer read one item at a time (`fusevol.kube.listing`): the same items and
resourceVersion as `json.loads` reads, a malformed answer refused whole before any item is read,
and never more than one item's objects alive while they are read."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

from fusevol.kube.listing import lazy_list, scan

Obj = dict[str, Any]

STORED_POD: Obj = json.loads(
    (Path(__file__).parents[1] / "fixtures/apiserver/configmap-secret.json").read_text()
)["stored"]
"""A pod as kube-apiserver v1.28 stored it, every defaulted field filled in."""


def _replica(i: int) -> Obj:
    metadata = {**STORED_POD["metadata"], "name": f"web-{i}", "uid": f"uid-{i}"}
    item = {**STORED_POD, "metadata": metadata}
    del item["kind"], item["apiVersion"]  # a list's items carry neither
    return item


def _pod_list(items: list[Obj], *, version: str = "4711") -> Obj:
    """In kube-apiserver's order: kind, apiVersion, metadata, items."""
    metadata = {"resourceVersion": version}
    return {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}


def _read(text: str) -> tuple[list[Obj], str]:
    lazy, version = lazy_list(text.encode(), kind="Pod", api_version="v1")
    return list(lazy), version


def _expected(text: str) -> tuple[list[Obj], str]:
    body = json.loads(text)
    items = [{"kind": "Pod", "apiVersion": "v1", **item} for item in body.get("items") or []]
    return items, str(body.get("metadata", {}).get("resourceVersion", ""))


PODS = [_replica(i) for i in range(3)]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(json.dumps(_pod_list(PODS), separators=(",", ":")), id="as-the-server-sends"),
        pytest.param(json.dumps(_pod_list(PODS), indent=2), id="indented"),
        pytest.param(
            json.dumps({"items": PODS, "metadata": {"resourceVersion": "9"}, "kind": "PodList"}),
            id="metadata-after-items",
        ),
        pytest.param(json.dumps(_pod_list([])), id="no-items"),
        pytest.param('{"kind": "PodList", "items": null, "metadata": {}}', id="items-null"),
        pytest.param(" {\n} \n", id="empty-object"),
        pytest.param(
            '{"items":[{"kind":"Other","metadata":{}}],"metadata":{"resourceVersion":"3"}}',
            id="item-with-kind",
        ),
    ],
)
def test_items_and_version_are_those_json_reads(text: str) -> None:
    assert _read(text) == _expected(text)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@given(
    items=st.lists(st.dictionaries(st.text(), _JSON, max_size=4), max_size=4),
    others=st.fixed_dictionaries(
        {},
        optional={
            "kind": st.text(),
            "metadata": st.fixed_dictionaries({}, optional={"resourceVersion": st.text()}),
            "x": _JSON,
        },
    ),
    items_first=st.booleans(),
    indent=st.sampled_from([None, 0, 1, "\t"]),
)
def test_any_list_reads_as_json_reads_it(
    items: list[Obj], others: Obj, items_first: bool, indent: int | str | None
) -> None:
    document = {"items": items, **others} if items_first else {**others, "items": items}
    text = json.dumps(document, indent=indent)
    assert _read(text) == _expected(text)


def test_each_read_decodes_anew_and_clear_lets_the_text_go() -> None:
    lazy, _ = lazy_list(json.dumps(_pod_list(PODS)).encode(), kind="Pod", api_version="v1")
    assert len(lazy) == 3
    first = lazy[0]
    assert first["metadata"]["name"] == "web-0"
    first["metadata"]["name"] = "changed"
    assert lazy[0] is not first
    assert lazy[0]["metadata"]["name"] == "web-0"
    assert [item["metadata"]["name"] for item in lazy[1:]] == ["web-1", "web-2"]
    assert lazy[-1]["metadata"]["name"] == "web-2"
    lazy.clear()
    assert len(lazy) == 0
    assert list(lazy) == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        "{",
        '{"items":[{}]',
        '{"items":[{}],}',
        '{"items":[{},]}',
        '{"items":[1]}',
        '{"items":[{}] "kind":"PodList"}',
        '{"metadata":{}} trailing',
        "{1: 2}",
        '{"items":[{"a":1}, {"a": }]}',
    ],
)
def test_a_malformed_answer_is_refused_whole(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected|Expecting|extra data"):
        scan(text)


def test_bytes_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(ValueError, match="can't decode"):
        lazy_list(b'{"items":[{"a":"\xff"}]}', kind="Pod", api_version="v1")


def test_the_items_are_read_one_at_a_time() -> None:
    """Scanning and reading 1000 pods holds the answer's text and a pod's objects at a time:
    each pod's dicts are freed before the next pod's are made, which then reuse their blocks
    (`json.loads` of the list holds all 1000)."""
    text = json.dumps(_pod_list([_replica(i) for i in range(1000)])).encode()
    tracemalloc.start()
    try:
        held = json.loads(json.dumps(_replica(0)))
        one_pod = tracemalloc.get_traced_memory()[0]
        del held
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        lazy, _ = lazy_list(text, kind="Pod", api_version="v1")
        names = sum(item["metadata"]["name"].startswith("web-") for item in lazy)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert names == 1000
    assert one_pod > 5000  # a pod is some kilobytes of dicts, lists and strings
    starts = 16 * 1000  # where each pod starts: an array of 8-byte ints, grown by doubling
    assert peak < len(text) + starts + 4 * one_pod  # the one read, the one before, some slack
