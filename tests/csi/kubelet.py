"""kubelet v1.28's CSI volume plugin for inline (ephemeral) volumes, played over real gRPC.

Does what `pkg/volume/csi` does for a pod's `csi:` volume of driver fusevol.io, whose CSIDriver
says `podInfoOnMount: true`, `volumeLifecycleModes: [Ephemeral]` (and, when the test gives
tokens, `tokenRequests` + `requiresRepublish`):

- registration (plugin watcher, then csi_plugin.go): GetPluginInfo, then NodeGetInfo;
- `NewMounter` (csi_plugin.go): `<kubelet dir>/pods/<uid>/volumes/kubernetes.io~csi/<volume>/`
  made with MkdirAll 0750, and `vol_data.json` written in it (specVolID, volumeHandle,
  driverName, nodeName, attachmentID, volumeLifecycleMode);
- `SetUpAt` (csi_mounter.go): MkdirAll(parent of target, 0750); volume context = the pod's
  `volumeAttributes` + the podInfoOnMount keys (+ `serviceAccount.tokens` as JSON
  audience -> TokenRequestStatus); NodeGetCapabilities (`NodeSupportsVolumeMountGroup`, asked on
  every SetUp: with VOLUME_MOUNT_GROUP the fsGroup goes to the driver); NodePublishVolume with id
  `csi-<sha256(pod uid + volume name)>`, the target `.../<volume>/mount`, readonly from the pod's
  `csi.readOnly`, access mode SINGLE_NODE_WRITER, mount capability with `fsType` (empty when
  unset), no mount flags, `volume_mount_group` = fsGroup; on a final error (any code but
  Canceled, DeadlineExceeded, Unavailable, ResourceExhausted, Aborted) `removeMountDir`;
- `TearDownAt`: NodeUnpublishVolume(volume id, target), then `removeMountDir`: if the target is
  not a mount point, remove it, `vol_data.json` and the volume directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

import grpc

from fusevol.csi import csi_pb2 as pb

if TYPE_CHECKING:
    from pathlib import Path

    from google.protobuf.message import Message

DRIVER = "fusevol.io"
NON_FINAL = {
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
}
Obj = dict[str, Any]


def volume_handle(uid: str, volume_name: str) -> str:
    return "csi-" + hashlib.sha256(f"{uid}{volume_name}".encode()).hexdigest()


class Kubelet:
    def __init__(self, kubelet_dir: Path, socket: Path, node_name: str) -> None:
        self.dir = kubelet_dir
        self.socket = socket
        """The driver's CSI socket."""
        self.node_name = node_name
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self.calls: list[str] = []

    def close(self) -> None:
        self._channel.close()

    def _call(self, service: str, method: str, request: Message, response: type[Message]) -> Any:
        self.calls.append(method)
        rpc: grpc.UnaryUnaryMultiCallable[Message, Any] = self._channel.unary_unary(
            f"/csi.v1.{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )
        return rpc(request, timeout=150)  # kubelet's csiTimeout is 2 min

    def register(self) -> tuple[str, str]:
        """(driver name, node id), as the plugin watcher and `RegisterPlugin` ask them."""
        info = self._call(
            "Identity", "GetPluginInfo", pb.GetPluginInfoRequest(), pb.GetPluginInfoResponse
        )
        node = self._call("Node", "NodeGetInfo", pb.NodeGetInfoRequest(), pb.NodeGetInfoResponse)
        return info.name, node.node_id

    def probe(self) -> bool:
        answer = self._call("Identity", "Probe", pb.ProbeRequest(), pb.ProbeResponse)
        return bool(answer.ready.value)

    def target(self, pod: Obj, volume_name: str) -> Path:
        uid: str = pod["metadata"]["uid"]
        return self.dir / "pods" / uid / "volumes" / "kubernetes.io~csi" / volume_name / "mount"

    def publish(
        self,
        pod: Obj,
        volume_name: str,
        *,
        tokens: dict[str, str] | None = None,
        forged_target: Path | None = None,
        forged_handle: str | None = None,
    ) -> Path:
        """SetUp of the pod's csi volume `volume_name`; grpc.RpcError as kubelet gets it.
        `forged_*`: what a misbehaving caller would send instead of kubelet's values."""
        meta, spec = pod["metadata"], pod["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == volume_name)
        csi = volume["csi"]
        assert csi["driver"] == DRIVER
        target = forged_target or self.target(pod, volume_name)
        handle = forged_handle or volume_handle(meta["uid"], volume_name)
        volume_dir = target.parent
        volume_dir.mkdir(mode=0o750, parents=True, exist_ok=True)  # NewMounter
        (volume_dir / "vol_data.json").write_text(
            json.dumps(
                {
                    "specVolID": volume_name,
                    "volumeHandle": handle,
                    "driverName": DRIVER,
                    "nodeName": self.node_name,
                    "attachmentID": "",
                    "volumeLifecycleMode": "Ephemeral",
                }
            )
        )
        os.makedirs(target.parent, 0o750, exist_ok=True)  # SetUpAt: MkdirAll(parentDir, 0750)
        context = dict(csi.get("volumeAttributes") or {})
        context.update(
            {
                "csi.storage.k8s.io/pod.name": meta["name"],
                "csi.storage.k8s.io/pod.namespace": meta.get("namespace", "default"),
                "csi.storage.k8s.io/pod.uid": meta["uid"],
                "csi.storage.k8s.io/serviceAccount.name": spec.get("serviceAccountName", "default"),
                "csi.storage.k8s.io/ephemeral": "true",
            }
        )
        if tokens is not None:
            context["csi.storage.k8s.io/serviceAccount.tokens"] = json.dumps(
                {
                    audience: {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}
                    for audience, token in tokens.items()
                }
            )
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        mount = pb.VolumeCapability.MountVolume(fs_type=csi.get("fsType", ""), mount_flags=[])
        # v1.28 asks every time (DelegateFSGroupToCSIDriver is GA), fsGroup or not.
        if self._supports_mount_group() and fs_group is not None:
            mount.volume_mount_group = str(fs_group)
        # csi_client.go's getNodeV1AccessModeMapper asks again: ReadWriteOnce is
        # SINGLE_NODE_SINGLE_WRITER for a driver with SINGLE_NODE_MULTI_WRITER, else
        # SINGLE_NODE_WRITER.
        modes = pb.VolumeCapability.AccessMode
        multi_writer = pb.NodeServiceCapability.RPC.SINGLE_NODE_MULTI_WRITER in self._capabilities()
        request = pb.NodePublishVolumeRequest(
            volume_id=handle,
            target_path=str(target),
            readonly=bool(csi.get("readOnly", False)),
            volume_context=context,
            volume_capability=pb.VolumeCapability(
                mount=mount,
                access_mode=modes(
                    mode=modes.SINGLE_NODE_SINGLE_WRITER
                    if multi_writer
                    else modes.SINGLE_NODE_WRITER
                ),
            ),
        )
        try:
            self._call("Node", "NodePublishVolume", request, pb.NodePublishVolumeResponse)
        except grpc.RpcError as exc:
            if exc.code() not in NON_FINAL:
                self._remove_mount_dir(target)
            raise
        return target

    def unpublish(self, pod: Obj, volume_name: str) -> None:
        """TearDown: NodeUnpublishVolume, then removeMountDir."""
        target = self.target(pod, volume_name)
        request = pb.NodeUnpublishVolumeRequest(
            volume_id=volume_handle(pod["metadata"]["uid"], volume_name), target_path=str(target)
        )
        self._call("Node", "NodeUnpublishVolume", request, pb.NodeUnpublishVolumeResponse)
        self._remove_mount_dir(target)

    def _capabilities(self) -> set[int]:
        answer = self._call(
            "Node",
            "NodeGetCapabilities",
            pb.NodeGetCapabilitiesRequest(),
            pb.NodeGetCapabilitiesResponse,
        )
        return {c.rpc.type for c in answer.capabilities}

    def _supports_mount_group(self) -> bool:
        return pb.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP in self._capabilities()

    def _remove_mount_dir(self, target: Path) -> None:
        if is_mount_point(target):
            return
        for path in (target, target.parent / "vol_data.json", target.parent):
            with contextlib.suppress(FileNotFoundError):
                # os.Remove: a symlink itself, never what it points to
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()


def is_mount_point(path: Path) -> bool:
    wanted = str(path.absolute())
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return any(line.split()[4] == wanted for line in f)
