"""kubelet's plugin registration of driver `fusevol.io` (`registration.proto`, what
node-driver-registrar answers): a socket in kubelet's `plugins_registry` that kubelet's plugin
watcher finds and asks what it is (GetInfo: a CSIPlugin named fusevol.io at the CSI socket, CSI
1.0.0), then tells how registration went (NotifyRegistrationStatus).

kubelet registers the driver again, with a moment in which it does not know it, whenever a new
socket appears at that path (its plugin watcher compares creation times). So whoever lives
longest answers it: the agent itself, or in the chart `fusevol hold`, which a rollout never
restarts (`fusevol.agent.holder`). The socket is bound aside and renamed into place: a
successor's replaces its predecessor's in one step, and a path kubelet knows is never missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc

from fusevol.base.errors import FusevolError
from fusevol.base.fsutil import unlink_if_same
from fusevol.csi import registration_pb2 as reg
from fusevol.csi.attributes import DRIVER

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from google.protobuf.message import Message

log = logging.getLogger(__name__)


def registration_socket(kubelet_dir: Path) -> Path:
    """Where kubelet's plugin watcher looks for the driver's registration socket."""
    return kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"


class Registration:
    """Answers kubelet's plugin watcher at `path` for the CSI socket at `endpoint`."""

    def __init__(self, path: Path, *, endpoint: Path) -> None:
        self.path = path
        self._endpoint = endpoint
        self._server: grpc.Server | None = None
        self._inode = 0

    def start(self) -> None:
        """Listen (blocking: call it from a thread in trio)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=1, thread_name_prefix="csi-reg"))
        server.add_generic_rpc_handlers([self._handler()])
        self._inode = listen_in_place(server, self.path, "reg")
        self._server = server
        log.info("csi registration socket for kubelet path=%s", self.path)

    def stop(self, *, remove: bool) -> None:
        """Stop answering; `remove` the socket too (kubelet then forgets the driver), unless it
        is a successor's by now."""
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        if remove:
            unlink_if_same(self.path, self._inode)

    def _handler(self) -> grpc.GenericRpcHandler:
        def get_info(request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
            return reg.PluginInfo(
                type="CSIPlugin",
                name=DRIVER,
                endpoint=str(self._endpoint),
                supported_versions=["1.0.0"],
            )

        def notify(
            request: reg.RegistrationStatus, context: grpc.ServicerContext
        ) -> reg.RegistrationStatusResponse:
            if request.plugin_registered:
                log.info("csi driver registered with kubelet driver=%s", DRIVER)
            else:
                log.error(
                    "kubelet refused the csi driver driver=%s error=%s", DRIVER, request.error
                )
            return reg.RegistrationStatusResponse()

        return grpc.method_handlers_generic_handler(
            "pluginregistration.Registration",
            {
                "GetInfo": unary(reg.InfoRequest, get_info),
                "NotifyRegistrationStatus": unary(reg.RegistrationStatus, notify),
            },
        )


def listen_in_place(server: grpc.Server, path: Path, name: str) -> int:
    """Start `server` on a socket bound aside (`.<name>.<pid>` beside `path`) and renamed to
    `path`: a predecessor's is replaced in one step, so a connect never finds the path missing
    (kubelet's plugin watcher sees one new socket, never none). Returns the socket's inode."""
    aside = path.with_name(f".{name}.{os.getpid()}")  # short: a socket's path has 107 bytes
    with contextlib.suppress(FileNotFoundError):
        aside.unlink()
    try:
        server.add_insecure_port(f"unix:{aside}")
    except RuntimeError as exc:
        raise FusevolError(f"csi: cannot listen on {aside}: {exc}") from None
    server.start()
    inode = os.lstat(aside).st_ino
    os.replace(aside, path)
    return inode


def unary(
    request_type: type[Message], handler: Callable[[Any, grpc.ServicerContext], Message]
) -> grpc.RpcMethodHandler[Any, Message]:
    """A unary gRPC method: `handler` with `request_type` in, any message out."""
    return grpc.unary_unary_rpc_method_handler(
        handler,
        request_deserializer=request_type.FromString,
        response_serializer=lambda message: message.SerializeToString(),
    )
