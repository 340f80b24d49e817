"""The client configuration, as the `kubernetes` package reads it: the agent's one module that
imports `kubernetes` (the webhook's client, `fusevol.webhook.cluster`, is configured here too).

An explicit kubeconfig, or kubelet's client certificate with the in-cluster API server
(`kubelet_credentials.ClientCertificate`), else in-cluster when running in a pod, else the
standard kubeconfig resolution (`$KUBECONFIG`, `~/.kube/config`); exec credential plugins and
the in-cluster token's rotation run through the configuration's refresh hook (`credentials`
asks it). A kubeconfig's embedded keys are kept in memory, never in files.

Excludes: what is made of it: the TLS contexts (`tls`), the Authorization header
(`credentials`), the connections (`transport`).
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import TYPE_CHECKING, Any

import kubernetes

from fusevol.base.errors import FusevolError
from fusevol.kube.kubelet_credentials import ClientCertificate

if TYPE_CHECKING:
    from pathlib import Path

_IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


def in_cluster() -> bool:
    """True inside a pod (the service account's API server address is in the environment)."""
    return bool(os.environ.get(_IN_CLUSTER_ENV))


def load_configuration(kubeconfig: Path | ClientCertificate | None) -> Any:
    """The `kubernetes` package's client configuration: `kubeconfig` (a path, or kubelet's
    client certificate), else in-cluster in a pod, else the standard kubeconfig resolution
    ($KUBECONFIG, ~/.kube/config).

    A kubeconfig's embedded data (`certificate-authority-data`, `client-certificate-data`,
    `client-key-data`, an exec plugin's `clientKeyData`) is handed to TLS as files: the package
    writes them to $TMPDIR, removed only at a clean exit. Here they are memory files instead
    (`_memory_file`), so a private key never reaches a disk and a killed agent leaves none."""
    kube_config = kubernetes.config.kube_config
    kube_config._create_temp_file_with_content = _memory_file  # its one writer of files
    config = kubernetes.client.Configuration()
    if isinstance(kubeconfig, ClientCertificate):
        config.host = kubeconfig.server
        config.ssl_ca_cert = str(kubeconfig.ca_file)
        config.cert_file = config.key_file = str(kubeconfig.pem)  # the symlink kubelet rotates
        return config
    try:
        if kubeconfig is not None:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig), client_configuration=config
            )
        elif in_cluster():
            kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
        else:
            kubernetes.config.load_kube_config(client_configuration=config)  # type: ignore[no-untyped-call]
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = kubeconfig or ("in-cluster" if in_cluster() else "kubeconfig")
        raise FusevolError(f"Kubernetes client configuration ({where}): {exc}") from None
    return config


_memory_files: dict[bytes, str] = {}
_memory_files_lock = threading.Lock()


def _memory_file(
    content: bytes | str, temp_file_path: str | None = None, force_recreate: bool = False
) -> str:
    """The kubeconfig loader's `_create_temp_file_with_content` (its one writer of files, called
    while loading and from the refresh hook), with a memfd for the file: sealed, closed on exec,
    gone with the process, named `/proc/self/fd/N` for `ssl` to open. One per content, as the
    loader's own cache keeps one file per content; nothing can remove one, so `force_recreate`
    (for a file removed meanwhile) has nothing to do, and `temp_file_path` no place to say."""
    del temp_file_path, force_recreate
    data = content.encode() if isinstance(content, str) else content
    with _memory_files_lock:
        if (path := _memory_files.get(data)) is None:
            fd = os.memfd_create("kubeconfig-data", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            with open(fd, "wb", closefd=False) as file:
                file.write(data)
            seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            path = _memory_files[data] = f"/proc/self/fd/{fd}"
    return path
