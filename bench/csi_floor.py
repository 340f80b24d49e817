"""The floor of a CSI volume's set-up: a node plugin that does nothing but what every one must,
the baseline of `bench/csi_publish.py`.

kubelet sets a CSI volume up through three calls, each on a new connection (two
NodeGetCapabilities, then NodePublishVolume), and the driver must at least make the target and
bind something on it. This server does exactly that and nothing else: bare grpcio, as fusevol's
CSI server, fusevol.io's own Node capabilities (`fusevol.csi.server.node_capabilities`), and
NodePublishVolume a read-only bind of one directory (`fusevol.mount.syscalls.bind`, what
fusevol's mount helper does, less making the bind shared), answered in the gRPC thread. What a
converted volume costs beyond it is fusevol's own work. On the cluster kit the same floor (a
host process registered as a second driver) took 8.3 ms from a pod's first mount started to its
last set up (4 volumes), against 4.7 ms with kubelet's own volumes, 5.7 ms through the same
floor in Go (`bench/csi_floor.go`) and 11.1 ms through fusevol, whose publishes of prepared
volumes are one bind in gRPC's thread (medians of 15 lone pods each, interleaved:
docs/performance.md, "CSI volumes").

    .venv/bin/python bench/csi_floor.py SOCKET SOURCE     (root: binds; serves until killed)
"""

from __future__ import annotations

import contextlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusevol.csi import csi_pb2 as pb
from fusevol.csi.registration import unary
from fusevol.csi.server import node_capabilities
from fusevol.mount import syscalls


def serve(socket: Path, source: Path) -> grpc.Server:
    """The floor's server on `socket`, started; its publishes bind `source`."""

    def publish(
        request: pb.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodePublishVolumeResponse:
        syscalls.bind(str(source), request.target_path, True, False, 0o750, None)
        return pb.NodePublishVolumeResponse()

    def unpublish(
        request: pb.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnpublishVolumeResponse:
        with contextlib.suppress(OSError):  # EINVAL: no mount (left) there
            while True:
                syscalls.umount2(request.target_path, 0)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(request.target_path)
        return pb.NodeUnpublishVolumeResponse()

    node = {
        "NodeGetCapabilities": unary(pb.NodeGetCapabilitiesRequest, node_capabilities),
        "NodePublishVolume": unary(pb.NodePublishVolumeRequest, publish),
        "NodeUnpublishVolume": unary(pb.NodeUnpublishVolumeRequest, unpublish),
    }
    server = grpc.server(
        ThreadPoolExecutor(max_workers=64),
        handlers=[grpc.method_handlers_generic_handler("csi.v1.Node", node)],
    )
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


def main() -> None:
    socket, source = Path(sys.argv[1]), Path(sys.argv[2])
    socket.parent.mkdir(parents=True, exist_ok=True)
    serve(socket, source).wait_for_termination()


if __name__ == "__main__":
    main()
