"""Command line: argv and `FUSEVOL_*` environment variables -> Settings -> the agent.

    fusevol run [--manifests DIR | --kubeconfig PATH | --source kubernetes]
                [--change-detection Watch|Cache|Get] [--root DIR] [--node-name NAME] ...
    fusevol status [--root DIR] [--json]
    fusevol teardown [--root DIR]
    fusevol wait [--root DIR] POD [--timeout 2m]
    fusevol mounts [--root DIR] POD --container NAME [--format ctr|oci|json]
    fusevol hold [--root DIR]
    fusevol webhook --tls-cert FILE --tls-key FILE [--port 8443] ...
    fusevol convert -f FILE [--token-request AUDIENCE[=SECONDS]]

The source: `--manifests DIR` serves a directory of manifests; otherwise the Kubernetes API is the
source when `--kubeconfig` is given or when running in a pod (in-cluster configuration);
`--source kubernetes` also selects it with the standard kubeconfig resolution (`$KUBECONFIG`,
`~/.kube/config`).
Every flag of `run` can also be set as an environment variable `FUSEVOL_<FLAG>` (upper case,
dashes as underscores: `FUSEVOL_NODE_NAME`); a flag given on the command line wins. An empty
variable counts as unset; a value the flag would not take is bad usage, named by its variable,
unless the flag is given (checked before anything is parsed: `--version` too). The defaults are
`fusevol.base.settings`'.
Exit codes: 0 after a clean stop, 1 for a fusevol error (printed as one line), 2 for bad usage.

This package parses the command line and dispatches; each command is a module of its own:
`run` (the agent's process, after `fusevol.agent.launcher` forked it), `status`, `teardown`, and
`runtime` (`wait` and `mounts`, what a container runtime asks); `hold` is
`fusevol.agent.holder`'s; `webhook` (`webhook` and `convert`, `fusevol.webhook`'s).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusevol import __version__
from fusevol.agent import preflight
from fusevol.agent.launcher import LAUNCHER_FD_ENV, launch
from fusevol.base.errors import FusevolError
from fusevol.base.settings import (
    DEFAULT_KUBELET_DIR,
    DEFAULT_ROOT as DEFAULT_ROOT,  # the default the deployment files repeat (tests/deploy)
    ChangeDetection,
    HttpSettings,
    KubeSettings,
)
from fusevol.cli import webhook as cli_webhook
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

DESCRIPTION = (
    "A Kubernetes node agent for pod volumes: ConfigMap, Secret, downwardAPI and projected "
    "volumes served from memory through FUSE, in kubelet's layout; nfs, local, hostPath, "
    "emptyDir and gitRepo volumes mounted as kubelet mounts them."
)
RUN_EPILOG = (
    "Every flag is also an environment variable FUSEVOL_<FLAG>, upper case, dashes as "
    "underscores (FUSEVOL_ROOT, FUSEVOL_HTTP_PORT, ...); a flag on the command line wins. The "
    "defaults shown include those set so. SIGTERM hands over (pod volumes stay mounted for the "
    "next agent); SIGINT (Ctrl-C) unmounts every pod volume."
)
ROOT_HELP = "the agent's root: pod volumes under DIR/pods/ (default: %(default)s)"
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class _BadVariable:
    """A `FUSEVOL_*` variable whose value its flag would not take: bad usage of any command
    (`--version` and `--help` included) unless the flag itself is given, which wins."""

    flag: str
    variable: str
    value: str
    reason: str

    def given_in(self, argv: Sequence[str]) -> bool:
        return any(arg == self.flag or arg.startswith(f"{self.flag}=") for arg in argv)

    def usage_error(self) -> str:
        return f"fusevol: error: {self.variable}={self.value!r}: {self.reason}\n"


class _Parser(argparse.ArgumentParser):
    """Refuses a bad `FUSEVOL_*` variable before anything is parsed (`_BadVariable`)."""

    bad_variables: list[_BadVariable]

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = sys.argv[1:] if args is None else list(args)
        for bad in getattr(self, "bad_variables", ()):
            if not bad.given_in(argv):
                self.exit(2, bad.usage_error())
        return super().parse_known_args(argv, namespace)


_BAD_VARIABLES: list[_BadVariable] = []
"""Filled while `_parser()` builds the parser; the top-level parser checks them."""


def _env_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: object = None,
    type: Callable[[str], object] = str,
    choices: Sequence[object] | None = None,
    **kwargs: Any,
) -> None:
    """`parser.add_argument(flag, ...)` whose default is `FUSEVOL_<FLAG>` when that is set and
    not empty, converted and checked as the flag's value would be."""
    variable = "FUSEVOL_" + flag.removeprefix("--").upper().replace("-", "_")
    if value := os.environ.get(variable):
        reason = ""
        try:
            converted = type(value)
        except (TypeError, ValueError):  # what argparse catches from a type
            reason = f"invalid {getattr(type, '__name__', repr(type))} value"
        else:
            if choices is not None and converted not in choices:
                reason = f"invalid choice (choose from {', '.join(map(repr, choices))})"
        if reason:
            _BAD_VARIABLES.append(_BadVariable(flag, variable, value, reason))
        else:
            default = converted
    if kwargs.get("action") == "store_true":  # a flag: the variable says whether it is given
        parser.add_argument(flag, default=default, **kwargs)
    else:
        parser.add_argument(flag, type=type, choices=choices, default=default, **kwargs)


def boolean(text: str) -> bool:
    """A flag's variable: true, yes or 1; false, no or 0 (any case); anything else is bad."""
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    try:
        return words[text.lower()]
    except KeyError:
        raise ValueError(text) from None


def _root_option(parser: argparse.ArgumentParser) -> None:
    _env_option(parser, "--root", type=Path, metavar="DIR", default=DEFAULT_ROOT, help=ROOT_HELP)


def _parser() -> argparse.ArgumentParser:
    _BAD_VARIABLES.clear()
    parser = _Parser(prog="fusevol", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fusevol {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    kube = KubeSettings()
    http = HttpSettings()

    run = commands.add_parser(
        "run",
        help="serve the volumes of this node's pods until stopped",
        description="Serve the volumes of this node's pods until stopped.",
        epilog=RUN_EPILOG,
    )
    _env_option(
        run,
        "--manifests",
        type=Path,
        metavar="DIR",
        help="directory of manifests to serve, watched for edits: Pods, ConfigMaps, Secrets, "
        "PersistentVolumes, PersistentVolumeClaims, StorageClasses (*.yaml, *.yml, *.json)",
    )
    _env_option(
        run,
        "--source",
        choices=["manifests", "kubernetes"],
        help="where pods come from (default: manifests with --manifests, else kubernetes "
        "with --kubeconfig or in a pod)",
    )
    _env_option(
        run,
        "--kubeconfig",
        type=Path,
        metavar="PATH",
        help="kubeconfig of the API server (default: in-cluster, $KUBECONFIG, ~/.kube/config)",
    )
    _env_option(
        run,
        "--change-detection",
        choices=[c.value for c in ChangeDetection],
        default=kube.change_detection.value,
        help="how referenced ConfigMaps and Secrets are kept current, as kubelet's "
        "configMapAndSecretChangeDetectionStrategy (default: %(default)s)",
    )
    _env_option(
        run,
        "--sync-period",
        type=float,
        metavar="SECONDS",
        default=kube.sync_period_s,
        help="seconds between refetches with --change-detection Cache or Get "
        "(default: %(default)s)",
    )
    _env_option(
        run,
        "--cache-ttl",
        type=float,
        metavar="SECONDS",
        default=kube.cache_ttl_s,
        help="seconds a fetched object stays fresh with --change-detection Cache "
        "(default: %(default)s)",
    )
    _root_option(run)
    _env_option(
        run,
        "--node-name",
        metavar="NAME",
        default=socket.gethostname(),
        help="serve pods with this spec.nodeName, or none (default: the host name, %(default)s)",
    )
    _env_option(
        run,
        "--node-allocatable",
        metavar="LIST",
        default="",
        help="what the downward API reports for containers without limits, e.g. "
        "cpu=4,memory=8Gi,ephemeral-storage=100Gi (default: the host's capacity)",
    )
    _env_option(
        run,
        "--http-port",
        type=int,
        metavar="PORT",
        default=http.port,
        help="port of /healthz, /readyz, /metrics and /status; 0: any free port, -1: none "
        "(default: %(default)s)",
    )
    _env_option(
        run,
        "--http-host",
        metavar="ADDRESS",
        default=http.host,
        help="address they listen on; /status names this node's pods and their errors, so "
        "the default is loopback (default: %(default)s)",
    )
    _env_option(
        run,
        "--replace",
        action="store_true",
        type=boolean,
        default=False,
        help="if an agent serves this root, take its FUSE connection over and have it retire (a "
        "rollout: no read fails); without it a second agent is refused (FUSEVOL_REPLACE=true)",
    )
    _env_option(
        run,
        "--http-auth",
        choices=("kubernetes", "none"),
        default="kubernetes",
        help="who may read /metrics and /status: root on this node (on loopback) and whom the "
        "API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get "
        "nodes/metrics, nodes/proxy of this node), loopback callers too, as kubelet's API; "
        "none: anyone (default: %(default)s)",
    )
    _env_option(
        run,
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="a file created once the agent serves, removed when it stops: for an exec readiness "
        "probe when the HTTP port may be another agent's (default: none)",
    )
    _env_option(
        run,
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        default="info",
        help="debug, info, warning or error (default: %(default)s)",
    )
    _env_option(
        run,
        "--csi-endpoint",
        default="",
        help="serve the CSI node plugin fusevol.io at unix:///path/csi.sock: pods get volumes "
        "through kubelet (then pods' own volumes are not set up; default: off)",
    )
    _env_option(
        run,
        "--kubelet-dir",
        type=Path,
        default=DEFAULT_KUBELET_DIR,
        help="kubelet's root directory: CSI target paths must be below it (default: %(default)s)",
    )
    _env_option(
        run,
        "--csi-token-requests",
        type=boolean,
        default=True,
        metavar="true|false",
        help="request by TokenRequest the serviceAccountToken audiences kubelet does not pass "
        "(missing from the CSIDriver's tokenRequests); false: kubelet's tokens only, and the "
        "agent needs no right to mint tokens (default: %(default)s)",
    )
    _env_option(
        run,
        "--csi-read-as",
        choices=("agent", "pod"),
        default="agent",
        help="whose identity reads a CSI volume's ConfigMaps and Secrets: the agent's, or the "
        "pod's own (its service account's token for the API server's audience, which kubelet "
        "passes when the CSIDriver's tokenRequests list audience \"\"): the pod's RBAC then "
        "decides what it may mount (default: %(default)s)",
    )
    _env_option(
        run,
        "--csi-registration",
        choices=("agent", "holder"),
        default="agent",
        help="who answers kubelet's plugin registration of the driver: the agent, or `fusevol "
        "hold --csi-endpoint ...` (a rollout then never registers it again) (default: "
        "%(default)s)",
    )

    teardown = commands.add_parser(
        "teardown",
        help="unmount every pod volume and remove the pod directories, after a handing-over "
        "stop (refused while an agent runs)",
    )
    _root_option(teardown)

    show = commands.add_parser(
        "status",
        help="whether an agent runs; its pods, volumes, state and last error, or without an "
        "agent what is still mounted",
    )
    _root_option(show)
    show.add_argument("--json", action="store_true", help="print it as JSON")

    wait = commands.add_parser(
        "wait",
        help="wait until every volume of a pod (and its containers' subPath views) is set up",
        description="Exit 0 once every volume of POD is set up; on timeout exit 1 naming each "
        "volume not ready and its last error.",
    )
    _root_option(wait)
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
    _root_option(mounts)
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
    _root_option(hold)
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
    parser.bad_variables = list(_BAD_VARIABLES)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.umask(layout.UMASK)  # whatever we were started with: modes never depend on it
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            if LAUNCHER_FD_ENV not in os.environ:
                preflight.check(
                    root=args.root,
                    kubeconfig=args.kubeconfig,
                    fuse=True,
                    http=(args.http_host, args.http_port),
                    replace=args.replace,
                )
                # Imported before the fork, run only in the child: a child the launcher starts
                # after a crash serves again without first spending a second or two on imports.
                import fusevol.agent.app  # noqa: F401

                root = args.root.absolute()
                launched = launch(
                    layout.handover_socket(root),
                    holder_socket=layout.holder_socket(root),
                    replace=args.replace,
                )
                if launched is not None:
                    # the launcher's: the agent runs in its child (fusevol.agent.launcher)
                    return launched
            from fusevol.cli import run

            return run.main(args)
        if args.command == "teardown":
            preflight.check(root=args.root, kubeconfig=None, fuse=False)
            from fusevol.cli import teardown

            return teardown.main(args)
        if args.command == "hold":
            from fusevol.agent import holder
            from fusevol.base import log

            log.setup("info")
            return holder.hold(
                args.root.absolute(),
                csi_endpoint=args.csi_endpoint,
                kubelet_dir=args.kubelet_dir.absolute(),
            )
        if args.command == "webhook":
            return cli_webhook.serve(args)
        if args.command == "convert":
            return cli_webhook.convert(args)
        if args.command in ("wait", "mounts"):
            from fusevol.cli import runtime

            return runtime.main(args)
        from fusevol.cli import status

        return status.main(args)
    except FusevolError as exc:
        print(f"fusevol: {exc}", file=sys.stderr)
        return 1
    except ExceptionGroup as group:  # raised in a trio nursery: the agent's own errors, unwrapped
        errors, others = group.split(FusevolError)
        if errors is None or others is not None:
            raise
        for error in _leaves(errors):
            print(f"fusevol: {error}", file=sys.stderr)
        return 1


def _leaves(group: BaseExceptionGroup[FusevolError]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
