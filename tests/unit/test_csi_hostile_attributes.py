"""CSI volume attributes as a hostile pod author writes them: each is refused INVALID_ARGUMENT
before anything walks it (no recursion, no exponential walk, no unbounded parse), and an
unexpected exception in a call answers that call INTERNAL with one error line; the server
serves the next call."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from fusevol.csi import registration_pb2 as reg
from fusevol.csi.attributes import MAX_VOLUME_BYTES, Code, parse
from fusevol.csi.registration import unary
from tests.unit.test_csi_attributes import context, refused, request

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

ALIASES = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)
"""Some 400 bytes that are 10^9 strings to whatever walks them (a "billion laughs")."""


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        pytest.param("[" * 100_000, "not YAML or JSON", id="yaml-100000-levels"),
        pytest.param(
            '{"configMap": ' * 100 + '{"name": "a"}' + "}" * 100, "nested more than 32", id="json"
        ),
        pytest.param(
            "[" * 50_000 + "]" * 50_000, "maximum nesting depth", id="json-past-the-decoders-limit"
        ),
        pytest.param("configMap: {name: a}\n" + ALIASES, "YAML alias", id="billion-laughs"),
        pytest.param("configMap: !!timestamp x", "cannot be constructed", id="bad-tag"),
        pytest.param("configMap: {name: " + "a" * MAX_VOLUME_BYTES + "}", "too long", id="size"),
    ],
)
def test_a_hostile_volume_attribute_is_refused(tmp_path: Path, volume: str, message: str) -> None:
    args = request(tmp_path)
    found = refused(Code.INVALID_ARGUMENT, **{**args, "context": context(volume=volume)})
    assert "volumeAttributes 'volume' " in found
    assert message in found
    assert "\n" not in found
    assert len(found) < 500


def test_an_item_path_of_100000_levels_is_parsed_and_left_to_the_payload_rules(
    tmp_path: Path,
) -> None:
    """The API server takes such a path (it checks no length); the set-up refuses it, naming the
    field (tests/unit/test_deep_input.py), as kubelet's AtomicWriter does."""
    path = "/".join(["d"] * 99_999 + ["f"])
    volume = json.dumps({"configMap": {"name": "app", "items": [{"key": "k", "path": path}]}})
    publication = parse(**{**request(tmp_path), "context": context(volume=volume)})
    assert publication.volume.source.items[0].path == path  # type: ignore[union-attr]


def test_nested_tokens_are_refused(tmp_path: Path) -> None:
    args = request(tmp_path)
    tokens = {**args["context"], "csi.storage.k8s.io/serviceAccount.tokens": "[" * 100_000}
    assert "map of audience to token" in refused(
        Code.INVALID_ARGUMENT, **{**args, "context": tokens}
    )


# -- a call that raises ----------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[grpc.Channel]:
    """A gRPC server on a unix socket whose GetInfo raises RecursionError until it is called
    with `name` "ok", and whose NotifyRegistrationStatus aborts (a refusal of its own)."""

    def get_info(request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        raise RecursionError("maximum recursion depth exceeded")

    def notify(request: reg.RegistrationStatus, context: grpc.ServicerContext) -> Any:
        if request.plugin_registered:
            return reg.RegistrationStatusResponse()
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused on purpose")

    service = grpc.server(ThreadPoolExecutor(max_workers=2))
    service.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "pluginregistration.Registration",
                {
                    "GetInfo": unary(reg.InfoRequest, get_info),
                    "NotifyRegistrationStatus": unary(reg.RegistrationStatus, notify),
                },
            )
        ]
    )
    service.add_insecure_port(f"unix:{tmp_path / 's.sock'}")
    service.start()
    with grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel:
        yield channel
    service.stop(grace=None)


def call(channel: grpc.Channel, method: str, request: Any, response: Any) -> Any:
    return channel.unary_unary(
        f"/pluginregistration.Registration/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )(request, timeout=10)


def test_an_unexpected_exception_answers_internal_with_one_line_and_the_server_serves_on(
    server: grpc.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as failed:
            call(server, "GetInfo", reg.InfoRequest(), reg.PluginInfo)
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert "RecursionError: maximum recursion depth exceeded" in str(failed.value.details())
    with pytest.raises(grpc.RpcError) as aborted:
        call(server, "NotifyRegistrationStatus", reg.RegistrationStatus(), reg.PluginInfo)
    assert aborted.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # its own status kept
    ok = reg.RegistrationStatus(plugin_registered=True)
    assert call(server, "NotifyRegistrationStatus", ok, reg.RegistrationStatusResponse) == (
        reg.RegistrationStatusResponse()
    )
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.exc_info) for r in lines] == [("fusevol.csi.registration", None)] * 2
    assert "csi call failed method=get_info error=RecursionError" in lines[0].getMessage()
    caplog.clear()
