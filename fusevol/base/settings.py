"""Settings, one frozen dataclass per subsystem; units are in the names.

`fusevol.cli` fills them from flags and `FUSEVOL_*` environment variables; no other setting
comes from the environment (what else reads it are process protocols: the launcher's descriptors,
systemd's NOTIFY_SOCKET and LISTEN_FDS, and one debugging aid, `FUSEVOL_TRACEMALLOC` in
`fusevol.base.heap`). The defaults are here, and only here: the flags' defaults are read from
them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class FuseSettings:
    entry_timeout_s: float = 300.0
    """How long the kernel may cache a name lookup. Long is safe: visible nodes never change, and
    every structural change goes through the VFS, which updates the kernel's cache itself."""
    attr_timeout_s: float = 300.0
    """How long the kernel may cache attributes; safe for the same reason."""
    old_version_grace_s: float = 2.0
    """How long an old version stays after `..data` moved on, for readers that resolved `..data`
    just before the switch (docs/fuse.md fact 6)."""
    max_tasks: int = 8
    """Concurrent request handlers in pyfuse3.main; requests are CPU-bound, a few suffice."""
    pinned_names: int = 100_000
    """Served names whose kernel entries are kept (`fusevol.fuse.pins`): a read after the kernel
    dropped its caches then costs one request, not three. About 1.4 KiB of kernel memory each (a
    dentry, an inode and the pin holder's open file; kubelet's tmpfs copy holds a dentry and an
    inode a name too, and its pages); 0 pins none."""


@dataclass(frozen=True, slots=True)
class ReconcileSettings:
    resync_interval_s: float = 60.0
    """A full pass runs at least this often even when nothing changed: kubelet's syncFrequency."""
    initial_backoff_s: float = 0.5
    """First wait after a failed operation: kubelet's initialDurationBeforeRetry."""
    max_backoff_s: float = 122.0
    """Longest wait between retries: kubelet's maxDurationBeforeRetry (2m2s)."""


@dataclass(frozen=True, slots=True)
class MountSettings:
    command_timeout_s: float = 60.0
    """A mount or umount command running longer fails its operation (and only that one)."""
    git_timeout_s: float = 300.0
    """A git command of a gitRepo volume running longer fails that volume's set-up (a clone of
    a large repository over a slow link takes minutes; a hung one must not hold it forever)."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "127.0.0.1"
    """Address of /healthz, /readyz, /metrics and /status: loopback by default, because
    `/status` names the node's pods and their errors. A deployment that probes or scrapes it from
    elsewhere says where (the chart: the pod's IP)."""
    port: int = 9842
    """0 picks a free port; a negative port disables the server."""
    ready_file: Path | None = None
    """Created once the agent serves every volume of its first pass, removed as soon as it
    stops: for an exec readiness probe where the HTTP port may be another agent's (a DaemonSet
    pod on the host network, during a rollout: the old and the new pod share the node's port)."""
    auth: bool = True
    """`/metrics` and `/status` answer root on this node, and any other caller (loopback
    included) only if the API server says it may (`fusevol.observe.auth`); False
    (`--http-auth none`): they answer anyone."""


class ChangeDetection(enum.Enum):
    """kubelet's `configMapAndSecretChangeDetectionStrategy` (docs/kubelet.md fact 7)."""

    WATCH = "Watch"
    CACHE = "Cache"
    GET = "Get"


KUBELET = "kubelet"
"""The `--kubeconfig` that is no path: kubelet's own credentials (`KubeletCredentials`)."""


@dataclass(frozen=True, slots=True)
class KubeletCredentials:
    """kubelet's own credentials, wherever the node's distribution keeps them (`--kubeconfig
    kubelet`: found by `fusevol.kube.kubelet_credentials`)."""

    kubelet_dir: Path
    """kubelet's root directory: some distributions keep its kubeconfig there, and a
    bootstrapped kubelet its client certificate (`pki/`)."""


@dataclass(frozen=True, slots=True)
class KubeSettings:
    kubeconfig: Path | KubeletCredentials | None = None
    """None: in-cluster configuration inside a pod, else `$KUBECONFIG` or `~/.kube/config`."""
    change_detection: ChangeDetection = ChangeDetection.WATCH
    """How referenced ConfigMaps, Secrets, claims and volumes are kept current."""
    sync_period_s: float = 60.0
    """Cache and Get refetch at this period: kubelet's syncFrequency (1 min)."""
    cache_ttl_s: float = 60.0
    """The Cache strategy's TTL: kubelet's default without the node's TTL annotation (1 min)."""


DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
"""`CsiSettings.kubelet_dir` when none is given: kubelet's own default --root-dir."""


@dataclass(frozen=True, slots=True)
class CsiSettings:
    """The CSI node plugin (`fusevol.csi`)."""

    endpoint: str
    """Where to serve CSI's Identity and Node services: `unix:///path/csi.sock`."""
    kubelet_dir: Path
    """kubelet's --root-dir: every target path must be a CSI volume target below it."""
    register: bool = True
    """Answer kubelet's plugin registration (`fusevol.csi.registration`); False where
    `fusevol hold` answers it."""
    token_requests: bool = True
    """With the API source, request by TokenRequest the tokens kubelet did not pass (audiences
    missing from the CSIDriver's tokenRequests); False: kubelet's only, and the agent needs no
    permission to mint tokens."""
    read_as_pod: bool = False
    """With the API source, read a CSI volume's ConfigMaps and Secrets with its pod's token for
    the API server's audience (kubelet passes it when the CSIDriver's tokenRequests list
    `audience: ""`), so that the pod's RBAC decides; False: with the agent's identity."""


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """The audit of reads (`fusevol.fuse.audit`; which volumes: `fusevol.model.audit`)."""

    default: str = "off"
    """The node's level for every pod: `off`, `secrets` or `all` (pods and namespaces may ask
    for more, never less)."""
    stdout: bool = False
    """Also copy each record to the agent's standard output, for the node's log collector (the
    file under the root is written either way)."""
    server: str = "agent"
    """Who starts the audit server when a volume is audited: `agent`; `external`, another
    supervisor (the chart's audit DaemonSet, which outlives the agent's rollouts); `none`: no
    volume may be audited on this node (one that asks fails, saying so)."""
    runtime_state: Path | None = Path("/run/containerd")
    """containerd's state directory: the audit server reads the containers' names from it."""


DEFAULT_ROOT = "/var/lib/fusevol"
"""`Settings.root` when none is given."""


@dataclass(frozen=True, slots=True)
class Settings:
    root: Path
    """The agent's root directory: kubelet's --root-dir layout (`pods/<uid>/volumes/...`)."""
    node_name: str
    """Pods whose spec.nodeName names another node are not served."""
    manifests: Path | None
    """The directory of manifests to serve (the embedded default source)."""
    kube: KubeSettings | None = None
    """Serve this node's pods from the Kubernetes API instead (then `manifests` is None)."""
    node_allocatable: dict[str, str] = field(default_factory=dict)
    """What the downward API reports for a container without a cpu, memory or ephemeral-storage
    limit (kubelet takes the Node's allocatable): resource name -> quantity. A resource not given
    here is the host's capacity (every CPU, MemTotal, the root file system's size)."""
    fuse: FuseSettings = field(default_factory=FuseSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    mount: MountSettings = field(default_factory=MountSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    csi: CsiSettings | None = None
    """Serve kubelet's CSI calls (then only what kubelet publishes is served, not pod volumes)."""
    audit: AuditSettings = field(default_factory=AuditSettings)
