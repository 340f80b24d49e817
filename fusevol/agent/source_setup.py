"""Which source the settings ask for, and what the agent needs of it (`build_source`).

A manifest directory (`fusevol.source.local`) or the Kubernetes API (`fusevol.source.kube`, as
the kubeconfig given, or with kubelet's own credentials, found on the node by
`fusevol.kube.kubelet_credentials`); with each, where the hostpath provisioner records the PVs
it creates (the agent's own record, `fusevol.provision.record`, or PV objects through the API,
`fusevol.kube.provisioned`), and how the CSI plugin has the source keep a published volume's
objects current.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from fusevol.base.errors import FusevolError
from fusevol.base.settings import KubeletCredentials
from fusevol.node import layout
from fusevol.provision.hostpath import PROVISIONER
from fusevol.provision.record import ManifestVolumeRecorder
from fusevol.source.local import ManifestSource

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import trio

    from fusevol.base.settings import Settings
    from fusevol.csi.node import Tracker
    from fusevol.kube.transport import ClientStatistics
    from fusevol.model import Pod
    from fusevol.provision.hostpath import VolumeRecorder
    from fusevol.volumemanager.cache.desired import VolumeToServe
    from fusevol.volumemanager.cache.store import ObjectStore


class Source(Protocol):
    """Where pods and the objects they reference come from: a manifest directory
    (fusevol.source.local) or the Kubernetes API (fusevol.source.kube)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None:
        """Deliver the complete initial state to the store, report started, then follow it."""

    def volume_failed(self, volume: VolumeToServe, error: str) -> None:
        """Record a failed set-up or refresh where the source's users see it."""

    def volume_frozen(self, pod: Pod, spec_name: str, message: str) -> None:
        """Record that a container reads the pod's volume through a dead connection."""

    def statistics(self) -> Any:
        """A frozen dataclass of counters, for the status snapshot."""


class BuiltSource(NamedTuple):
    source: Source
    recorder: VolumeRecorder
    """Where provisioned PVs are recorded: through the API, or in the agent's own file."""
    manifest_recorder: ManifestVolumeRecorder | None
    """The agent's own record, which it loads before any source runs (manifests only)."""
    csi_track: Tracker | None
    """How the CSI plugin has the source keep a published volume's objects current (the API
    source's `track`; None for manifests, which hold every object of their directory)."""
    name: str
    """The source in the CSI plugin's refusals."""
    post: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None
    """The API client's POST (the reviews of `fusevol.observe.auth`); None without the API."""
    api: Callable[[], ClientStatistics] | None = None
    """The API client's connections and streams now (for `/metrics`); None without the API."""


def build_source(settings: Settings, store: ObjectStore) -> BuiltSource:
    """The source the settings ask for, and what the agent needs of it."""
    if settings.kube is not None:
        # Imported here: the kubernetes client takes 0.4 s to import, for nothing without it.
        from fusevol.csi.attributes import pod_sources
        from fusevol.kube import kubelet_credentials
        from fusevol.kube.client import KubeClient
        from fusevol.kube.provisioned import KubeVolumeRecorder
        from fusevol.source.kube.source import KubeSource

        kubeconfig = settings.kube.kubeconfig
        if isinstance(kubeconfig, KubeletCredentials):
            found = kubelet_credentials.find(kubelet_dir=kubeconfig.kubelet_dir)
            client = KubeClient(kubeconfig=found)
        else:
            client = KubeClient(kubeconfig=kubeconfig)
        recorder = KubeVolumeRecorder(
            client=client, node_name=settings.node_name, provisioner=PROVISIONER
        )
        source = KubeSource(
            client=client,
            node_name=settings.node_name,
            store=store,
            settings=settings.kube,
            recorder=recorder,
            pod_volumes=settings.csi is None,
            read_as_pod=settings.csi is not None and settings.csi.read_as_pod,
            csi_sources=pod_sources,
        )
        return BuiltSource(
            source, recorder, None, source.track, "API source", client.post, client.statistics
        )
    if settings.manifests is None:
        raise FusevolError("no source: give --manifests DIR or --kubeconfig PATH")
    manifest_recorder = ManifestVolumeRecorder(
        path=layout.provisioned_file(settings.root), store=store
    )
    manifests = ManifestSource(
        directory=settings.manifests, node_name=settings.node_name, store=store
    )
    return BuiltSource(manifests, manifest_recorder, manifest_recorder, None, "manifest source")
