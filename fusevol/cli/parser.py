"""The parser of every command: `fusevol` itself (`--version`, the commands), and each command's
flags, with their help and defaults; `run`'s many are fusevol.cli.run_parser's.

`build_parser()` builds it anew, reading the `FUSEVOL_*` variables as it goes
(fusevol.cli.environment). Nothing here loads what a command runs (the agent, trio, the webhook's
server): `main` (fusevol.cli) imports that for the command asked for, once the line is parsed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fusevol import __version__
from fusevol.base.settings import DEFAULT_KUBELET_DIR
from fusevol.cli import run_parser, webhook as cli_webhook
from fusevol.cli.environment import BAD_VARIABLES, Parser, root_option
from fusevol.cli.run_parser import LOG_LEVELS

if TYPE_CHECKING:
    import argparse

DESCRIPTION = (
    "A Kubernetes node agent for pod volumes: ConfigMap, Secret, downwardAPI and projected "
    "volumes served from memory through FUSE, in kubelet's layout; nfs, local, hostPath, "
    "emptyDir and gitRepo volumes mounted as kubelet mounts them."
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, built anew: each call reads the `FUSEVOL_*` variables."""
    BAD_VARIABLES.clear()
    parser = Parser(prog="fusevol", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fusevol {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser.add(commands)

    teardown = commands.add_parser(
        "teardown",
        help="unmount every pod volume and remove the pod directories, after a handing-over "
        "stop (refused while an agent runs)",
    )
    root_option(teardown)

    show = commands.add_parser(
        "status",
        help="whether an agent runs; its pods, volumes, state and last error, or without an "
        "agent what is still mounted",
    )
    root_option(show)
    show.add_argument("--json", action="store_true", help="print it as JSON")

    wait = commands.add_parser(
        "wait",
        help="wait until every volume of a pod (and its containers' subPath views) is set up",
        description="Exit 0 once every volume of POD is set up; on timeout exit 1 naming each "
        "volume not ready and its last error.",
    )
    root_option(wait)
    wait.add_argument("pod", metavar="POD", help="namespace/name or uid")
    wait.add_argument(
        "--timeout",
        default="2m",
        metavar="DURATION",
        help="give up after this long: 2m, 90s, 1m30s, 500ms (default: %(default)s)",
    )

    mounts = commands.add_parser(
        "mounts",
        help="a container's volumeMounts resolved to bind mounts, for a runtime without kubelet",
        description="Print the container's volumeMounts as kubelet resolves them (mountPath, "
        "readOnly, subPath, subPathExpr, mountPropagation): fusevol volumes bound rslave.",
    )
    root_option(mounts)
    mounts.add_argument("pod", metavar="POD", help="namespace/name or uid")
    mounts.add_argument("--container", required=True, metavar="NAME", help="the container")
    mounts.add_argument(
        "--format",
        choices=["ctr", "oci", "json"],
        default="ctr",
        help="ctr run --mount arguments, the OCI runtime spec's mounts array, or JSON "
        "(default: %(default)s)",
    )

    hold = commands.add_parser(
        "hold",
        help="keep the agent's FUSE connection outside its pod, for the next agent to take over",
        description="Hold duplicates of the serving agent's FUSE connection and give them to "
        "the next agent, so that readers wait instead of failing while no agent runs (a deleted "
        "agent pod). Runs until SIGTERM or SIGINT.",
    )
    root_option(hold)
    hold.add_argument(
        "--csi-endpoint",
        default="",
        help="also answer kubelet's plugin registration of the CSI driver fusevol.io served at "
        "this endpoint (the agent's --csi-endpoint, started with --csi-registration holder)",
    )
    hold.add_argument(
        "--kubelet-dir",
        type=Path,
        default=DEFAULT_KUBELET_DIR,
        help="kubelet's root directory: its plugins_registry holds the registration socket "
        "(default: %(default)s)",
    )

    webhook = commands.add_parser(
        "webhook",
        help="the mutating admission webhook: pods' configMap, secret, downwardAPI and "
        "projected volumes become fusevol.io CSI volumes",
        description="Serve the admission webhook over HTTPS (POST /mutate, /healthz, /readyz) "
        "until SIGTERM or SIGINT. It converts only while the CSIDriver fusevol.io exists.",
    )
    webhook.add_argument(
        "--tls-cert",
        type=Path,
        required=True,
        metavar="FILE",
        help="serving certificate (PEM), read again when it changes",
    )
    webhook.add_argument("--tls-key", type=Path, required=True, metavar="FILE", help="its key")
    webhook.add_argument(
        "--host",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address to listen on (default: %(default)s)",
    )
    webhook.add_argument(
        "--port",
        type=int,
        default=8443,
        metavar="PORT",
        help="port to listen on (default: %(default)s)",
    )
    webhook.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="PATH",
        help="kubeconfig of the API server (default: in-cluster, $KUBECONFIG, ~/.kube/config)",
    )
    webhook.add_argument(
        "--exclude-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="never convert pods of this namespace (repeatable; kube-system always)",
    )
    webhook.add_argument(
        "--shutdown-delay",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="after SIGTERM, serve this long as not ready (default: %(default)s)",
    )
    webhook.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        default="info",
        help="debug, info, warning or error (default: info)",
    )

    convert = commands.add_parser(
        "convert",
        help="print a manifest with its pods' volumes converted as the webhook would",
        description="Print the manifest (YAML or JSON; Pods and workloads' pod templates) with "
        "its configMap, secret, downwardAPI and projected volumes converted as the webhook "
        "would, taking the CSIDriver fusevol.io to exist; a report per pod on stderr.",
    )
    convert.add_argument(
        "-f",
        "--filename",
        dest="file",
        required=True,
        metavar="FILE",
        help="the manifest, or - for standard input",
    )
    convert.add_argument(
        "--token-request",
        type=cli_webhook.token_request,
        action="append",
        default=[],
        metavar="AUDIENCE[=SECONDS]",
        help="one of the CSIDriver's tokenRequests (SECONDS: 3600; repeatable): "
        "serviceAccountToken sources of that audience and lifetime convert",
    )
    parser.bad_variables = list(BAD_VARIABLES)
    return parser
