"""kubelet's own credentials, found on the node: what `fusevol run --kubeconfig kubelet` runs as
(user `system:node:<name>`, group `system:nodes`: `fusevol.source.kube.identity`), wherever the
node's distribution keeps them.

`find()` looks in this order, and says in one INFO line which it uses (the path, never the
content):

1. the first kubeconfig that exists of those the common distributions give kubelet's
   `--kubeconfig` (`KUBECONFIGS`; `/var/lib/kubelet` there is kubelet's root directory);
2. else kubelet's current client certificate, `<kubelet dir>/pki/kubelet-client-current.pem`
   (certificate and key in one file, where a bootstrapped kubelet keeps it: a symlink its
   certificate manager points at each new certificate, which `tls` reads again for the
   connections made after a rotation), with the in-cluster API server address
   ($KUBERNETES_SERVICE_HOST, $KUBERNETES_SERVICE_PORT) and cluster CA (`IN_CLUSTER_CA`) that
   the kubernetes package's in-cluster configuration reads; no token;
3. else a `FusevolError` naming every path tried.

It looks at paths and the environment only; loading what it found is `configuration`'s.
Excludes: a kubeconfig given by its path, the in-cluster service account's token.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fusevol.base.errors import FusevolError

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger(__name__)

KUBECONFIGS: tuple[tuple[str, str], ...] = (
    ("/etc/kubernetes/kubelet.conf", "kubeadm, kind, minikube, Cluster API"),
    ("{kubelet_dir}/kubeconfig", "GKE, EKS, AKS, kOps, OpenShift"),
    ("/var/lib/rancher/k3s/agent/kubelet.kubeconfig", "k3s"),
    ("/var/lib/rancher/rke2/agent/kubelet.kubeconfig", "RKE2"),
    ("/var/snap/microk8s/current/credentials/kubelet.config", "MicroK8s"),
)
"""Where the common distributions have kubelet's `--kubeconfig` point, in the order tried, with
who puts it there; `{kubelet_dir}`: kubelet's root directory (`/var/lib/kubelet`)."""
CLIENT_CERTIFICATE = "pki/kubelet-client-current.pem"
"""kubelet's current client certificate and key, below its root directory (its `--cert-dir`
by default)."""
IN_CLUSTER_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
"""The cluster CA where a pod finds it (the kubernetes package's `SERVICE_CERT_FILENAME`)."""
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_PORT_ENV = "KUBERNETES_SERVICE_PORT"
ASK = "give --kubeconfig PATH (the chart's rbac.node.kubeconfig)"


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """kubelet's client certificate and the in-cluster API server: credentials without a
    kubeconfig."""

    pem: Path
    """Certificate and key in one PEM file: the symlink's path, which kubelet switches to the
    new certificate at a rotation (never its target of the moment)."""
    server: str
    """The API server's URL, `https://<host>:<port>`."""
    ca_file: Path
    """The cluster CA, which signed the API server's certificate."""


def find(
    *, kubelet_dir: Path, root: Path = Path("/"), environ: Mapping[str, str] | None = None
) -> Path | ClientCertificate:
    """kubelet's credentials (module docstring, steps 1-3): a kubeconfig's path, else its client
    certificate with the in-cluster API server. `kubelet_dir`: kubelet's root directory;
    `root`: below which the paths are looked for (a test's fake node); `environ`: the
    environment (`os.environ`)."""
    environ = os.environ if environ is None else environ
    tried = []
    for template, who in KUBECONFIGS:  # (1)
        path = _below(root, template.format(kubelet_dir=kubelet_dir))
        if path.is_file():
            log.info("kubelet's credentials: kubeconfig=%s (%s)", path, who)
            return path
        tried.append(str(path))
    pem = _below(root, str(kubelet_dir / CLIENT_CERTIFICATE))  # (2)
    ca_file = _below(root, IN_CLUSTER_CA)
    host, port = environ.get(SERVICE_HOST_ENV), environ.get(SERVICE_PORT_ENV)
    if not pem.is_file():
        missing = f"no client certificate {pem}"
    elif not host or not port:
        missing = (
            f"client certificate {pem} but no API server address to use it with "
            f"(${SERVICE_HOST_ENV} and ${SERVICE_PORT_ENV} are unset outside a pod)"
        )
    elif not ca_file.is_file():
        missing = f"client certificate {pem} but no cluster CA {ca_file} to use it with"
    else:
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        log.info(
            "kubelet's credentials: client certificate=%s server=%s ca=%s (no kubeconfig of "
            "kubelet's found)",
            pem,
            server,
            ca_file,
        )
        return ClientCertificate(pem=pem, server=server, ca_file=ca_file)
    raise FusevolError(  # (3)
        f"--kubeconfig kubelet: kubelet's credentials not found: no kubeconfig "
        f"{', '.join(tried)}; {missing}; {ASK}"
    )


def _below(root: Path, path: str) -> Path:
    return root / path.lstrip("/")
