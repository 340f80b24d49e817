"""Command line: argv and `FUSEVOL_*` environment variables -> Settings -> the agent.

    fusevol run [--manifests DIR | --kubeconfig PATH|kubelet | --source kubernetes]
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

This package parses the command line (`parser`, and `run_parser` for `run`'s flags, with the
`FUSEVOL_*` defaults of `environment`) and dispatches (`main`, here); each command is a module of
its own: `run` (the agent's process, after `fusevol.agent.launcher` forked it), `status`,
`teardown`, and `runtime` (`wait` and `mounts`, what a container runtime asks); `hold` is
`fusevol.agent.holder`'s; `webhook` (`webhook` and `convert`, `fusevol.webhook`'s).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from fusevol.agent import preflight
from fusevol.agent.launcher import LAUNCHER_FD_ENV, launch
from fusevol.base.errors import FusevolError
from fusevol.base.settings import KUBELET
from fusevol.cli import webhook as cli_webhook
from fusevol.cli.parser import build_parser
from fusevol.node import layout

if TYPE_CHECKING:
    from collections.abc import Iterator


def main(argv: list[str] | None = None) -> int:
    os.umask(layout.UMASK)  # whatever we were started with: modes never depend on it
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            if LAUNCHER_FD_ENV not in os.environ:
                preflight.check(
                    root=args.root,
                    # kubelet's: the agent finds them, and says what it tried
                    kubeconfig=None if args.kubeconfig == KUBELET else args.kubeconfig,
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
