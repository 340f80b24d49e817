"""The CSI Identity and Node services of driver `fusevol.io`, over gRPC on a unix socket.

grpcio serves the calls in its own worker threads; each handler calls into the trio agent with
`trio.from_thread.run` (`CsiNode` does the work there) and maps a `CsiError` to its gRPC status;
any other exception answers its call INTERNAL with one error line (`registration.guarded`), and
the server and the agent serve on.
The service table is written here rather than generated (`csi_pb2_grpc.py`): the generated one is
untyped, and seven typed lines say the same. Messages are generated from `csi.proto`.

    Identity  GetPluginInfo          fusevol.io and fusevol's version
              GetPluginCapabilities  none (no controller service: inline volumes need none)
              Probe                  ready once the FUSE server and the sources are up
    Node      NodeGetInfo            node id = the node name
              NodeGetCapabilities    VOLUME_MOUNT_GROUP: kubelet hands over fsGroup, no chown walk
              NodePublishVolume      `CsiNode.publish`
              NodeUnpublishVolume    `CsiNode.unpublish`
Unless `fusevol hold` answers it (`registration=None`), the agent also answers kubelet's plugin
registration on its own socket (`fusevol.csi.registration`).
A successor (a rollout, an upgrade-restart) replaces both sockets with its own, each in one rename
(bound aside first): kubelet never finds either path missing. A stop that hands over leaves them
for the successor, and the stopping agent's server stays up (`linger`) until the successor's CSI
socket has replaced ours: a Node call that reaches us meanwhile, or that our stop interrupted,
waits for it and is forwarded to it, so that a pod created during a rollout gets its volume
without a kubelet retry. A tear-down removes both sockets (kubelet then forgets the driver).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import inotify_simple
import trio
from google.protobuf import wrappers_pb2

from fusevol import __version__
from fusevol.base.errors import FusevolError
from fusevol.base.fsutil import unlink_if_same
from fusevol.csi import csi_pb2 as pb
from fusevol.csi.attributes import DRIVER, CsiError, parse
from fusevol.csi.registration import Registration, listen_in_place, unary

if TYPE_CHECKING:
    from collections.abc import Callable

    from google.protobuf.message import Message

    from fusevol.csi.node import CsiNode

log = logging.getLogger(__name__)

WORKERS = 64
"""gRPC worker threads. Each call holds one until it is answered, a publish until its volume is
set up, and kubelet publishes every volume of every starting pod at once: a burst of 20 pods
of 4 volumes is 80 calls, which 8 threads let into the agent over ~190 ms, 64 over ~100 ms."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
LINGER_S = 30.0
"""How long a handing-over stop waits for its successor's CSI socket, forwarding Node calls."""
FORWARD_GRACE_S = 30.0
"""How long it then still gives the forwarded calls in flight to get their answers."""


def socket_path(endpoint: str) -> Path:
    """`unix:///path`, `unix:/path` or `/path` -> the socket's path."""
    path = endpoint.removeprefix("unix://").removeprefix("unix:")
    if not path.startswith("/"):
        raise FusevolError(f"--csi-endpoint {endpoint!r}: give unix:///absolute/path/csi.sock")
    return Path(path)


def node_capabilities(
    request: pb.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
) -> pb.NodeGetCapabilitiesResponse:
    """NodeGetCapabilities: VOLUME_MOUNT_GROUP, nothing else (module docstring)."""
    rpc = pb.NodeServiceCapability.RPC(type=pb.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP)
    return pb.NodeGetCapabilitiesResponse(capabilities=[pb.NodeServiceCapability(rpc=rpc)])


class CsiServer:
    def __init__(
        self,
        *,
        endpoint: str,
        node: CsiNode,
        ready: Callable[[], bool],
        registration: Path | None = None,
        handing_over: Callable[[], bool] = lambda: False,
    ) -> None:
        """`registration`: where to answer kubelet's plugin registration (module docstring), in
        kubelet's `plugins_registry`; `handing_over()` says, as we stop, whether a successor
        takes over, which then keeps the registration socket for it."""
        self.path = socket_path(endpoint)
        self.node = node
        self._ready = ready
        self._registration = registration
        self._handing_over = handing_over
        self._token: trio.lowlevel.TrioToken | None = None
        self._kept: grpc.Server | None = None
        """Our CSI server, kept running by a handing-over stop until `linger` ends."""
        self._inode = 0
        """Our CSI socket's: a successor's has another."""
        self._forwarding = threading.Event()
        """Set by a handing-over stop: Node calls go to the successor (`_forward`)."""
        self._replaced = threading.Event()
        """Set once the successor's socket is in place, or `linger` gave up waiting for it."""
        self._in_flight: set[trio.CancelScope] = set()
        """The calls being served in trio: a handing-over stop interrupts them (`_forward`)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: restore the recorded targets, then listen, and prepare the
        volumes of the pods the source delivers (`CsiNode.prepare`)."""
        self._token = trio.lowlevel.current_trio_token()
        await self.node.restore()
        await trio.to_thread.run_sync(_check_socket_path, self.path)
        server = grpc.server(
            ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="csi"),
            handlers=self._handlers(),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._inode = await trio.to_thread.run_sync(listen_in_place, server, self.path, "csi")
        registered: Registration | None = None
        try:
            log.info("csi listening endpoint=unix://%s driver=%s", self.path, DRIVER)
            if self._registration is not None:
                registered = Registration(self._registration, endpoint=self.path)
                await trio.to_thread.run_sync(registered.start)
            task_status.started()
            await self.node.prepare()
        finally:
            if self._handing_over():  # the successor replaces both sockets; we serve on
                self._kept = server
                self._forward_from_now()
            else:
                server.stop(grace=None)  # cancels calls in flight; kubelet retries them
                unlink_if_same(self.path, self._inode)
            if registered is not None:  # on a handing-over stop, the successor replaces it
                registered.stop(remove=not self._handing_over())

    def _forward_from_now(self) -> None:
        """A handing-over stop begins (on the trio thread): Node calls go to the successor,
        those in flight too (they wait for a reconciler that stopped)."""
        self._forwarding.set()
        for call in list(self._in_flight):
            call.cancel()

    async def linger(self, timeout_s: float = LINGER_S) -> None:
        """After a handing-over stop: wait until the successor's CSI socket replaces ours (or
        `timeout_s`), forwarding the Node calls that reach us meanwhile (`_forward`), then stop
        once those in flight have their answers. No-op after any other stop."""
        server, self._kept = self._kept, None
        if server is None:
            return
        with trio.move_on_after(timeout_s):
            await _wait_replaced(self.path, self._inode)
        if not self._is_replaced() and timeout_s > 0:
            log.warning("no successor took the CSI socket over within %.0f s", timeout_s)
        self._replaced.set()
        await trio.to_thread.run_sync(lambda: server.stop(grace=FORWARD_GRACE_S).wait())

    def _handlers(self) -> list[grpc.GenericRpcHandler]:
        publish = "/csi.v1.Node/NodePublishVolume"
        unpublish = "/csi.v1.Node/NodeUnpublishVolume"
        identity = {
            "GetPluginInfo": unary(pb.GetPluginInfoRequest, self._get_plugin_info),
            "GetPluginCapabilities": unary(
                pb.GetPluginCapabilitiesRequest, self._get_plugin_capabilities
            ),
            "Probe": unary(pb.ProbeRequest, self._probe),
        }
        node = {
            "NodeGetInfo": unary(pb.NodeGetInfoRequest, self._node_get_info),
            "NodeGetCapabilities": unary(pb.NodeGetCapabilitiesRequest, node_capabilities),
            "NodePublishVolume": unary(
                pb.NodePublishVolumeRequest,
                self._or_successor(publish, self._publish, pb.NodePublishVolumeResponse),
            ),
            "NodeUnpublishVolume": unary(
                pb.NodeUnpublishVolumeRequest,
                self._or_successor(unpublish, self._unpublish, pb.NodeUnpublishVolumeResponse),
            ),
        }
        return [
            grpc.method_handlers_generic_handler("csi.v1.Identity", identity),
            grpc.method_handlers_generic_handler("csi.v1.Node", node),
        ]

    # -- handlers, in gRPC's threads ---------------------------------------------------------------

    def _get_plugin_info(
        self, request: pb.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginInfoResponse:
        return pb.GetPluginInfoResponse(name=DRIVER, vendor_version=__version__)

    def _get_plugin_capabilities(
        self, request: pb.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginCapabilitiesResponse:
        return pb.GetPluginCapabilitiesResponse()

    def _probe(self, request: pb.ProbeRequest, context: grpc.ServicerContext) -> pb.ProbeResponse:
        ready = self._in_trio(context, self._ready_now)
        return pb.ProbeResponse(ready=wrappers_pb2.BoolValue(value=ready))

    async def _ready_now(self) -> bool:
        return self._ready()

    def _node_get_info(
        self, request: pb.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetInfoResponse:
        return pb.NodeGetInfoResponse(node_id=self.node.node_name)

    def _publish(
        self, request: pb.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodePublishVolumeResponse:
        if not request.volume_id or not request.target_path:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path required")
        capability = request.volume_capability
        if not capability.HasField("mount"):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"volume_capability: {DRIVER} volumes are file systems (mount), not block devices",
            )

        volume_context = dict(request.volume_context)
        mount_group = capability.mount.volume_mount_group
        # Prepared for this very request (`fusevol.csi.preparing`): published in this thread.
        if not self._forwarding.is_set():
            prepared = self.node.claim(
                request.volume_id, request.target_path, volume_context, mount_group
            )
            assert self._token is not None
            if prepared is not None and self.node.publish_prepared(prepared, self._token):
                return pb.NodePublishVolumeResponse()
        try:
            # Checked here, in gRPC's thread: the realpaths of its target are system calls, which
            # the trio thread, busy with the other publishes of a burst, need not make.
            publication = parse(
                volume_id=request.volume_id,
                target_path=request.target_path,
                context=volume_context,
                volume_mount_group=mount_group,
                kubelet_dir=self.node.kubelet_dir,
            )
        except CsiError as exc:
            _refuse(context, exc)

        async def publish() -> None:
            await self.node.publish(publication)

        self._in_trio(context, publish, forwardable=True)
        return pb.NodePublishVolumeResponse()

    def _unpublish(
        self, request: pb.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnpublishVolumeResponse:
        if not request.volume_id or not request.target_path:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path required")

        async def unpublish() -> None:
            await self.node.unpublish(volume_id=request.volume_id, target_path=request.target_path)

        self._in_trio(context, unpublish, forwardable=True)
        return pb.NodeUnpublishVolumeResponse()

    def _in_trio(
        self, context: grpc.ServicerContext, fn: Callable[[], Any], *, forwardable: bool = False
    ) -> Any:
        """Run `fn()` (async) in the agent's trio loop; a CsiError becomes its gRPC status. A
        `forwardable` one (a Node call) that a handing-over stop interrupts raises
        `_Interrupted`: the successor answers it (`_or_successor`)."""
        try:
            if forwardable:
                return trio.from_thread.run(self._interruptible, fn, trio_token=self._token)
            return trio.from_thread.run(fn, trio_token=self._token)
        except CsiError as exc:
            _refuse(context, exc)
        except (trio.RunFinishedError, trio.Cancelled, _Interrupted):
            if forwardable and self._forwarding.is_set():
                raise _Interrupted from None
            context.abort(grpc.StatusCode.UNAVAILABLE, "the fusevol agent is stopping")

    async def _interruptible(self, fn: Callable[[], Any]) -> Any:
        """`fn()`, unless a handing-over stop interrupts it, or began before the call reached
        the loop: `_Interrupted`. The stop cancels the calls in flight when it begins; a call
        whose handler saw no stop yet, but that reaches the loop after it, would otherwise wait
        for a reconciler that has stopped, and keep the lingering server from ending (a publish
        in a rollout, 30 s). Both run on the trio thread: one of them sees the other."""
        with trio.CancelScope() as scope:
            if not self._forwarding.is_set():
                self._in_flight.add(scope)
                try:
                    return await fn()
                finally:
                    self._in_flight.discard(scope)
        raise _Interrupted

    def _or_successor(
        self,
        method: str,
        handler: Callable[[Any, grpc.ServicerContext], Message],
        response_type: type[Message],
    ) -> Callable[[Any, grpc.ServicerContext], Message]:
        """`handler`, or once a handing-over stop began (or interrupted it), the successor's."""

        def call(request: Message, context: grpc.ServicerContext) -> Message:
            if not self._forwarding.is_set():
                with contextlib.suppress(_Interrupted):
                    return handler(request, context)
            return self._forward(method, request, response_type, context)

        call.__name__ = method.rsplit("/", 1)[-1]  # what `registration.guarded` logs
        return call

    def _forward(
        self,
        method: str,
        request: Message,
        response_type: type[Message],
        context: grpc.ServicerContext,
    ) -> Message:
        """Wait for the successor's socket (`linger`), then make the same call there."""
        if not self._replaced.wait(context.time_remaining()) or not self._is_replaced():
            context.abort(grpc.StatusCode.UNAVAILABLE, "the fusevol agent is stopping")
        try:
            with grpc.insecure_channel(f"unix:{self.path}") as channel:
                forward: grpc.UnaryUnaryMultiCallable[Message, Message] = channel.unary_unary(
                    method,
                    request_serializer=lambda message: message.SerializeToString(),
                    response_deserializer=response_type.FromString,
                )
                answer: Message = forward(request, timeout=context.time_remaining())
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")
        log.info("csi call forwarded to the next agent method=%s", method)
        return answer

    def _is_replaced(self) -> bool:
        with contextlib.suppress(FileNotFoundError):
            return os.lstat(self.path).st_ino != self._inode
        return False


class _Interrupted(Exception):
    """A Node call our handing-over stop cancelled: the successor answers it instead."""


def _refuse(context: grpc.ServicerContext, exc: CsiError) -> NoReturn:
    """Answer the call with `exc`'s gRPC status (`context.abort` raises)."""
    log.info("csi call refused code=%s error=%s", exc.code.value, exc)
    context.abort(grpc.StatusCode[exc.code.value], str(exc))
    raise AssertionError("grpc's abort returned")  # it raises: this line only tells mypy


def _check_socket_path(path: Path) -> None:
    """A previous agent's socket there (a crash, a predecessor) is replaced by ours; anything
    else is refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FusevolError(f"csi: {path} exists and is not a socket")


async def _wait_replaced(path: Path, inode: int) -> None:
    """Until `path` is another socket than `inode` (a successor renamed its own there)."""
    with inotify_simple.INotify() as watch:
        watch.add_watch(path.parent, inotify_simple.flags.MOVED_TO | inotify_simple.flags.CREATE)
        while True:
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_ino != inode:
                    return
            await trio.lowlevel.wait_readable(watch.fileno())
            watch.read(timeout=0)
