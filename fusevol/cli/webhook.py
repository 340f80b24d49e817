"""`fusevol webhook` and `fusevol convert`: the admission webhook, and what it does to a manifest.

    fusevol webhook --tls-cert FILE --tls-key FILE [--port 8443] [--host 0.0.0.0]
                    [--kubeconfig PATH] [--exclude-namespace NS ...] [--log-level info]
    fusevol convert -f FILE|- [--token-request AUDIENCE[=SECONDS] ...]

`convert` prints the manifest converted on stdout and a report per pod on stderr (exit 0; 1 if
the file cannot be read).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fusevol.base import log
from fusevol.base.errors import FusevolError

if TYPE_CHECKING:
    import argparse

    from fusevol.webhook.convert import TokenRequest


def serve(args: argparse.Namespace) -> int:
    from fusevol.webhook.app import WebhookSettings, serve

    log.setup(args.log_level)
    return serve(
        WebhookSettings(
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            host=args.host,
            port=args.port,
            kubeconfig=args.kubeconfig,
            excluded_namespaces=frozenset({"kube-system", *args.exclude_namespace}),
            shutdown_delay_s=args.shutdown_delay,
        )
    )


def convert(args: argparse.Namespace) -> int:
    from fusevol.webhook.convert import Driver
    from fusevol.webhook.manifests import convert_text

    origin = "<stdin>" if args.file == "-" else args.file
    try:
        text = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        raise FusevolError(f"{origin}: {exc.strerror}") from None
    requests = frozenset(args.token_request)
    driver = Driver(token_requests=requests, requires_republish=bool(requests))
    out, reports = convert_text(text, origin=origin, driver=driver)
    sys.stdout.write(out)
    for report in reports:
        for line in report.lines():
            print(line, file=sys.stderr)
    return 0


def token_request(text: str) -> TokenRequest:
    """AUDIENCE[=SECONDS], as one of the CSIDriver's tokenRequests (SECONDS: 3600)."""
    from fusevol.webhook.convert import TokenRequest

    audience, equals, seconds = text.partition("=")
    if not equals:
        return TokenRequest(audience)
    if not seconds.isdigit() or int(seconds) < 600:
        raise ValueError(text)
    return TokenRequest(audience, int(seconds))
