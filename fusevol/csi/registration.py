"""kubelet's plugin registration of driver `fusevol.io` (`registration.proto`, what
node-driver-registrar answers): a socket in kubelet's `plugins_registry` that kubelet's plugin
watcher finds and asks what it is (GetInfo: a CSIPlugin named fusevol.io at the CSI socket, CSI
1.0.0), then tells how registration went (NotifyRegistrationStatus).

kubelet registers the driver again, with a moment in which it does not know it, whenever a new
socket appears at that path (its plugin watcher compares creation times). So whoever lives
longest answers it: the agent itself, or in the chart `fusevol hold`, which a rollout never
restarts (`fusevol.agent.holder`). The socket is bound aside and renamed into place: a
successor's replaces its predecessor's in one step, and a path kubelet knows is never missing.

kubelet tries a registration socket once: it counts the plugin as known before its CSI handler
calls the driver (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go), so when
that call finds no CSI server (the holder's pod started before the agent's, as on every fresh
install), it refuses, Unavailable, and never asks again. node-driver-registrar exits then, and
its restart makes a new socket. Here the socket is made anew once the CSI socket answers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import traceback
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
        self._lock = threading.Lock()
        """Held while the server is swapped: `stop` and a new socket (`_offer_again`)."""
        self._stopped = threading.Event()

    def start(self) -> None:
        """Listen (blocking: call it from a thread in trio)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._listen()
        log.info("csi registration socket for kubelet path=%s", self.path)

    def stop(self, *, remove: bool) -> None:
        """Stop answering; `remove` the socket too (kubelet then forgets the driver), unless it
        is a successor's by now."""
        self._stopped.set()
        with self._lock:
            if self._server is not None:
                self._server.stop(grace=None)
                self._server = None
            if remove:
                unlink_if_same(self.path, self._inode)

    def _listen(self) -> None:
        """A server on a new socket in place of the current one (with `_lock` held)."""
        server = grpc.server(ThreadPoolExecutor(max_workers=1, thread_name_prefix="csi-reg"))
        server.add_generic_rpc_handlers([self._handler()])
        self._inode = listen_in_place(server, self.path, "reg")
        previous, self._server = self._server, server
        if previous is not None:
            previous.stop(grace=None)

    def _offer_again(self) -> None:
        """Once the CSI socket answers, a new registration socket: kubelet registers again."""
        while not self._stopped.wait(_PROBE_S):
            if _answers(self._endpoint):
                break
        with self._lock:
            if self._stopped.is_set():
                return
            self._listen()
        log.info("csi driver answers: registration socket made anew path=%s", self.path)

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
            elif _UNAVAILABLE in request.error:  # kubelet found no CSI server there yet
                log.info(
                    "kubelet could not reach the csi driver yet, registering again once it "
                    "answers endpoint=%s",
                    self._endpoint,
                )
                threading.Thread(
                    target=self._offer_again, name="csi-reg-again", daemon=True
                ).start()
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


_UNAVAILABLE = "code = Unavailable"
"""In kubelet's refusal when its call of the CSI socket found no server (grpc's status text)."""
_PROBE_S = 0.5
"""How often the CSI socket is tried meanwhile."""


def _answers(endpoint: Path) -> bool:
    """True if a server accepts connections on the unix socket `endpoint`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(endpoint))
        except OSError:
            return False
    return True


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
    """A unary gRPC method: `handler` with `request_type` in, any message out. Whatever it
    raises answers that call, never the server (`guarded`)."""
    return grpc.unary_unary_rpc_method_handler(
        guarded(handler),
        request_deserializer=request_type.FromString,
        response_serializer=lambda message: message.SerializeToString(),
    )


def guarded(
    handler: Callable[[Any, grpc.ServicerContext], Message],
) -> Callable[[Any, grpc.ServicerContext], Message]:
    """`handler`, an unexpected exception of which (a bug, or input nothing bounded yet) answers
    its call INTERNAL with one log line, where grpcio would answer UNKNOWN and log a traceback.
    The server and the agent serve on either way; a call the handler aborted keeps its status."""
    name = getattr(handler, "__name__", "call").lstrip("_")

    def call(request: Any, context: grpc.ServicerContext) -> Message:
        try:
            return handler(request, context)
        except Exception as exc:
            if _aborted(context):
                raise
            where = traceback.extract_tb(exc.__traceback__)[-1]
            log.error(
                "csi call failed method=%s error=%s: %s at=%s:%d",
                name,
                type(exc).__name__,
                exc,
                os.path.basename(where.filename),
                where.lineno or 0,
            )
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    return call


def _aborted(context: grpc.ServicerContext) -> bool:
    """Whether the handler called `context.abort`, whose exception carries the call's status
    already: grpcio's context says so by `code()`, which its type stubs lack."""
    code = getattr(context, "code", None)
    return code is not None and code() is not None
