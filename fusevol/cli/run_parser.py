"""The parser of `fusevol run`: the agent's flags, each with its help and its default.

Every flag is also a variable `FUSEVOL_<FLAG>` (fusevol.cli.environment); the defaults not set
so are `fusevol.base.settings`' (read from its dataclasses here, so that the help shows them).
What the parsed flags become, and the checks of their combinations, is fusevol.cli.run's, which
loads the agent; this module does not, so that every command parses without it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from fusevol.base.settings import (
    DEFAULT_KUBELET_DIR,
    KUBELET,
    AuditSettings,
    ChangeDetection,
    HttpSettings,
    KubeSettings,
)
from fusevol.cli.environment import boolean, env_option, root_option

if TYPE_CHECKING:
    import argparse

    from fusevol.cli.environment import Parser

RUN_EPILOG = (
    "Every flag is also an environment variable FUSEVOL_<FLAG>, upper case, dashes as "
    "underscores (FUSEVOL_ROOT, FUSEVOL_HTTP_PORT, ...); a flag on the command line wins. The "
    "defaults shown include those set so. SIGTERM hands over (pod volumes stay mounted for the "
    "next agent); SIGINT (Ctrl-C) unmounts every pod volume."
)
LOG_LEVELS = ("debug", "info", "warning", "error")


def add(commands: argparse._SubParsersAction[Parser]) -> None:
    """`fusevol run` and its flags, added to the top-level parser's `commands`."""
    kube = KubeSettings()
    http = HttpSettings()
    audit = AuditSettings()

    run = commands.add_parser(
        "run",
        help="serve the volumes of this node's pods until stopped",
        description="Serve the volumes of this node's pods until stopped.",
        epilog=RUN_EPILOG,
    )
    env_option(
        run,
        "--manifests",
        type=Path,
        metavar="DIR",
        help="directory of manifests to serve, watched for edits: Pods, ConfigMaps, Secrets, "
        "PersistentVolumes, PersistentVolumeClaims, StorageClasses (*.yaml, *.yml, *.json)",
    )
    env_option(
        run,
        "--source",
        choices=["manifests", "kubernetes"],
        help="where pods come from (default: manifests with --manifests, else kubernetes "
        "with --kubeconfig or in a pod)",
    )
    env_option(
        run,
        "--kubeconfig",
        type=kubeconfig,
        metavar="PATH",
        help="kubeconfig of the API server, or `kubelet`: run as this node with kubelet's own "
        "credentials, found where the common distributions keep them: its kubeconfig, else its "
        "client certificate below --kubelet-dir with the in-cluster API server (default: "
        "in-cluster, $KUBECONFIG, ~/.kube/config)",
    )
    env_option(
        run,
        "--change-detection",
        choices=[c.value for c in ChangeDetection],
        default=kube.change_detection.value,
        help="how referenced ConfigMaps and Secrets are kept current, as kubelet's "
        "configMapAndSecretChangeDetectionStrategy (default: %(default)s)",
    )
    env_option(
        run,
        "--sync-period",
        type=float,
        metavar="SECONDS",
        default=kube.sync_period_s,
        help="seconds between refetches with --change-detection Cache or Get "
        "(default: %(default)s)",
    )
    env_option(
        run,
        "--cache-ttl",
        type=float,
        metavar="SECONDS",
        default=kube.cache_ttl_s,
        help="seconds a fetched object stays fresh with --change-detection Cache "
        "(default: %(default)s)",
    )
    root_option(run)
    env_option(
        run,
        "--node-name",
        metavar="NAME",
        default=socket.gethostname(),
        help="serve pods with this spec.nodeName, or none (default: the host name, %(default)s)",
    )
    env_option(
        run,
        "--node-allocatable",
        metavar="LIST",
        default="",
        help="what the downward API reports for containers without limits, e.g. "
        "cpu=4,memory=8Gi,ephemeral-storage=100Gi (default: the host's capacity)",
    )
    env_option(
        run,
        "--http-port",
        type=int,
        metavar="PORT",
        default=http.port,
        help="port of /healthz, /readyz, /metrics and /status; 0: any free port, -1: none "
        "(default: %(default)s)",
    )
    env_option(
        run,
        "--http-host",
        metavar="ADDRESS",
        default=http.host,
        help="address they listen on; /status names this node's pods and their errors, so "
        "the default is loopback (default: %(default)s)",
    )
    env_option(
        run,
        "--replace",
        action="store_true",
        type=boolean,
        default=False,
        help="if an agent serves this root, take its FUSE connection over and have it retire (a "
        "rollout: no read fails); without it a second agent is refused (FUSEVOL_REPLACE=true)",
    )
    env_option(
        run,
        "--http-auth",
        choices=("kubernetes", "none"),
        default="kubernetes",
        help="who may read /metrics and /status: root on this node (on loopback) and whom the "
        "API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get "
        "nodes/metrics, nodes/proxy of this node), loopback callers too, as kubelet's API; "
        "none: anyone (default: %(default)s)",
    )
    env_option(
        run,
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="a file created once the agent serves, removed when it stops: for an exec readiness "
        "probe when the HTTP port may be another agent's (default: none)",
    )
    env_option(
        run,
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        default="info",
        help="debug, info, warning or error (default: %(default)s)",
    )
    env_option(
        run,
        "--csi-endpoint",
        default="",
        help="serve the CSI node plugin fusevol.io at unix:///path/csi.sock: pods get volumes "
        "through kubelet (then pods' own volumes are not set up; default: off)",
    )
    env_option(
        run,
        "--kubelet-dir",
        type=Path,
        default=DEFAULT_KUBELET_DIR,
        help="kubelet's root directory: CSI target paths must be below it, and `--kubeconfig "
        "kubelet` looks for kubelet's credentials there too (default: %(default)s)",
    )
    env_option(
        run,
        "--csi-token-requests",
        type=boolean,
        default=True,
        metavar="true|false",
        help="request by TokenRequest the serviceAccountToken audiences kubelet does not pass "
        "(missing from the CSIDriver's tokenRequests); false: kubelet's tokens only, and the "
        "agent needs no right to mint tokens (default: %(default)s)",
    )
    env_option(
        run,
        "--csi-read-as",
        choices=("agent", "pod"),
        default="agent",
        help="whose identity reads a CSI volume's ConfigMaps and Secrets: the agent's, or the "
        "pod's own (its service account's token for the API server's audience, which kubelet "
        "passes when the CSIDriver's tokenRequests list audience \"\"): the pod's RBAC then "
        "decides what it may mount (default: %(default)s)",
    )
    env_option(
        run,
        "--csi-registration",
        choices=("agent", "holder"),
        default="agent",
        help="who answers kubelet's plugin registration of the driver: the agent, or `fusevol "
        "hold --csi-endpoint ...` (a rollout then never registers it again) (default: "
        "%(default)s)",
    )
    env_option(
        run,
        "--audit",
        choices=("off", "secrets", "all"),
        default=audit.default,
        help="record every open of the files of this node's served volumes: secrets (volumes "
        "showing a Secret), all, or off; a pod's or namespace's annotation fusevol.io/audit may "
        "ask for more, never less (default: %(default)s)",
    )
    env_option(
        run,
        "--audit-stdout",
        type=boolean,
        default=audit.stdout,
        metavar="true|false",
        help="also copy each audit record to standard output, for the node's log collector; "
        "the records file under the root is written either way (default: %(default)s)",
    )
    env_option(
        run,
        "--audit-server",
        choices=("agent", "external", "none"),
        default="agent",
        help="who starts the audit server: the agent, or another supervisor (the chart's "
        "audit DaemonSet, which outlives the agent's rollouts); none: this node audits nothing, "
        "and a volume that asks for an audit fails, saying so (default: %(default)s)",
    )
    env_option(
        run,
        "--container-runtime-state",
        type=Path,
        metavar="DIR",
        default=audit.runtime_state,
        help="containerd's state directory, where the audit reads the names of containers "
        "(default: %(default)s)",
    )


def kubeconfig(value: str) -> Path | str:
    """`--kubeconfig`'s value: the word `kubelet` (kubelet's own credentials, found by the
    agent: `KUBELET`), else a kubeconfig's path (`./kubelet` for a file of that name)."""
    return KUBELET if value == KUBELET else Path(value)
