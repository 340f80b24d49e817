"""`fusevol run` in the agent's process: the parsed arguments -> `Settings` -> the agent.

Which source the arguments ask for (`--manifests`, `--kubeconfig`, `--source`, in a pod) and the
checks of their combinations (`--kubeconfig kubelet`: kubelet's own credentials, below
`--kubelet-dir`, which the agent finds as it starts); then `fusevol.agent.app` runs until
signalled.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from fusevol.base import heap, log
from fusevol.base.errors import FusevolError
from fusevol.base.settings import (
    KUBELET,
    AuditSettings,
    ChangeDetection,
    CsiSettings,
    HttpSettings,
    KubeletCredentials,
    KubeSettings,
    Settings,
)

if TYPE_CHECKING:
    import argparse
    from pathlib import Path


def main(args: argparse.Namespace) -> int:
    """`fusevol run`, in the agent's process (the launcher's child, or the only one)."""
    import trio  # here: `fusevol run`'s launcher (fusevol.agent.launcher) starts fast without it

    from fusevol.agent.app import run_until_signalled
    from fusevol.projection.downward import node_allocatable

    heap.one_arena()  # before the first thread
    heap.map_large_blocks()
    log.setup(args.log_level)
    kube = _kube_settings(args)
    if kube is None and not args.manifests.is_dir():
        raise FusevolError(f"--manifests {args.manifests}: not a directory")
    items = [item.strip() for item in args.node_allocatable.split(",") if item.strip()]
    try:
        if any("=" not in item for item in items):
            raise ValueError("expected name=quantity[,name=quantity...]")
        allocatable = dict(item.split("=", 1) for item in items)
        node_allocatable(allocatable)
    except ValueError as exc:
        raise FusevolError(f"--node-allocatable: {exc}") from None
    settings = Settings(
        root=args.root.absolute(),
        node_name=args.node_name,
        manifests=None if kube is not None else args.manifests.absolute(),
        kube=kube,
        node_allocatable=allocatable,
        http=HttpSettings(
            host=args.http_host,
            port=args.http_port,
            ready_file=args.ready_file,
            auth=args.http_auth == "kubernetes",
        ),
        csi=CsiSettings(
            args.csi_endpoint,
            args.kubelet_dir.absolute(),
            register=args.csi_registration == "agent",
            token_requests=args.csi_token_requests,
            read_as_pod=args.csi_read_as == "pod",
        )
        if args.csi_endpoint
        else None,
        audit=AuditSettings(
            default=args.audit,
            stdout=args.audit_stdout,
            server=args.audit_server,
            runtime_state=args.container_runtime_state.absolute(),
        ),
    )
    trio.run(run_until_signalled, settings)
    logging.getLogger(__name__).info("stopped")
    return 0


def _kube_settings(args: argparse.Namespace) -> KubeSettings | None:
    """None for the manifest source; the API source's settings otherwise (module docstring)."""
    source = args.source
    if source is None:
        if args.manifests is not None:
            source = "manifests"
        elif args.kubeconfig is not None or os.environ.get("KUBERNETES_SERVICE_HOST"):
            source = "kubernetes"
        else:
            raise FusevolError(
                "no source: give --manifests DIR or --kubeconfig PATH (or run in a pod)"
            )
    if source == "manifests":
        if args.manifests is None:
            raise FusevolError("--source manifests: give --manifests DIR (or FUSEVOL_MANIFESTS)")
        if args.kubeconfig is not None:
            raise FusevolError("--kubeconfig: not used with the manifests source")
        return None
    if args.manifests is not None:
        raise FusevolError("--manifests: not used with the kubernetes source")
    if args.sync_period <= 0 or args.cache_ttl < 0:
        raise FusevolError("--sync-period must be positive and --cache-ttl not negative")
    try:
        strategy = ChangeDetection(args.change_detection)
    except ValueError:
        raise FusevolError(
            f"--change-detection {args.change_detection}: not one of Watch, Cache, Get"
        ) from None
    if args.kubeconfig == KUBELET:
        kubeconfig: Path | KubeletCredentials | None = KubeletCredentials(
            kubelet_dir=args.kubelet_dir.absolute()
        )
    else:
        kubeconfig = None if args.kubeconfig is None else args.kubeconfig.absolute()
    return KubeSettings(
        kubeconfig=kubeconfig,
        change_detection=strategy,
        sync_period_s=args.sync_period,
        cache_ttl_s=args.cache_ttl,
    )
