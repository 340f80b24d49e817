"""kubelet's plugin registration, answered by `fusevol.csi.registration.Registration` alone: what
a refusal makes of the registration socket."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from fusevol.csi import registration_pb2 as reg
from fusevol.csi.registration import Registration
from tests.agent import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from google.protobuf.message import Message

UNAVAILABLE = (
    "RegisterPlugin error -- plugin registration failed with err: rpc error: code = Unavailable"
    ' desc = connection error: desc = "transport: Error while dialing: dial unix'
    ' /var/lib/kubelet/plugins/fusevol.io/csi.sock: connect: connection refused"'
)
"""kubelet 1.28's refusal when the driver's CSI socket has no server yet (measured)."""


@pytest.fixture
def registration(tmp_path: Path) -> Iterator[Registration]:
    answering = Registration(tmp_path / "fusevol.io-reg.sock", endpoint=tmp_path / "csi.sock")
    answering.start()
    yield answering
    answering.stop(remove=True)


def call(path: Path, method: str, request: Message, response: type[Message]) -> Any:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        rpc: grpc.UnaryUnaryMultiCallable[Message, Any] = channel.unary_unary(
            f"/pluginregistration.Registration/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )
        return rpc(request, timeout=10)


def refuse(path: Path, error: str) -> None:
    """What kubelet says when its registration of the driver failed."""
    status = reg.RegistrationStatus(plugin_registered=False, error=error)
    call(path, "NotifyRegistrationStatus", status, reg.RegistrationStatusResponse)


def test_a_refusal_for_want_of_a_csi_server_offers_a_new_socket_once_it_answers(
    registration: Registration, tmp_path: Path
) -> None:
    """kubelet never asks a registration socket twice: after it found no CSI server, a new
    socket (a new inode in place) makes it register again, once the CSI server answers."""
    first = registration.path.stat().st_ino
    refuse(registration.path, UNAVAILABLE)
    time.sleep(1.5)  # three probes of the CSI socket
    assert registration.path.stat().st_ino == first  # nothing answers at the CSI socket yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as csi:
        csi.bind(str(tmp_path / "csi.sock"))
        csi.listen()
        wait_for(lambda: registration.path.stat().st_ino != first, timeout_s=10)
    info = call(registration.path, "GetInfo", reg.InfoRequest(), reg.PluginInfo)
    assert (info.name, info.endpoint) == ("fusevol.io", str(tmp_path / "csi.sock"))


def test_any_other_refusal_is_an_error_and_the_socket_stays(
    registration: Registration, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = registration.path.stat().st_ino
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as csi:
        csi.bind(str(tmp_path / "csi.sock"))
        csi.listen()
        refuse(registration.path, "RegisterPlugin error -- plugin validation failed")
        with pytest.raises(TimeoutError):
            wait_for(lambda: registration.path.stat().st_ino != first, timeout_s=1.5)
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "kubelet refused the csi driver driver=fusevol.io"
        " error=RegisterPlugin error -- plugin validation failed"
    ]
    caplog.clear()
