"""The agent's HTTP/2 state machine per request: its time for one list request and its answer,
as `fusevol.kube.http2.state.new_state()` sets h2 up, beside h2's defaults (the baseline), in
one run.

No network: a client and a server state machine hand each other their bytes, and only the
client's calls are timed (send the request's headers, take in the answer's headers and body,
give the window back): what the agent's one trio thread spends in h2 and hpack for each of the
12000 requests that follow an API server restart at 3000 pods. The request is the reflector's
relist (a path of its own), with a service account's token (a kilobyte, as in a cluster) or
none (a client certificate: a node's kubelet credentials); the answer carries kube-apiserver
v1.28's headers (a new `audit-id` and `date` each time) and an empty list. `--watches N`: N
streams held open on the connection beside the requests (watches answered, streaming), as on a
connection that fills with watches while they start (kube-apiserver allows 250 streams).

    .venv/bin/python bench/h2_cost.py [--requests 5000] [--rounds 7] [--watches 249]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.events

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusevol.kube.http2.state import new_state, outbound
from tests.helpers.h2server import paired_with

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

TOKEN = b"Bearer " + b"eyJhbGciOiJSUzI1NiJ9." * 48
"""The length of a projected service account token."""
BODY = (
    b'{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"4242"},"items":[]}'
)


def request(n: int, token: bytes) -> list[tuple[bytes, bytes]]:
    path = (
        "/api/v1/namespaces/fusevol-bench/configmaps?fieldSelector=metadata.name%3Dcm-"
        f"{n}&resourceVersion={40000 + n}&resourceVersionMatch=NotOlderThan"
    )
    return [
        (b":method", b"GET"),
        (b":scheme", b"https"),
        (b":authority", b"10.96.0.1:443"),
        (b":path", path.encode()),
        (b"accept", b"application/json"),
        (b"user-agent", b"fusevol/0.1.0"),
        *([(b"authorization", token)] if token else []),
    ]


def answer_headers() -> list[tuple[bytes, bytes]]:
    return [
        (b":status", b"200"),
        (b"audit-id", str(uuid.uuid4()).encode()),
        (b"cache-control", b"no-cache, private"),
        (b"content-type", b"application/json"),
        (b"x-kubernetes-pf-flowschema-uid", b"44a0e453-2b1f-4f7c-9b8b-623e7abf260c"),
        (b"x-kubernetes-pf-prioritylevel-uid", b"e46cea07-5b5f-4b68-bc71-71404fc0e168"),
        (b"content-length", str(len(BODY)).encode()),
        (b"date", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()).encode()),
    ]


def h2_defaults() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )


def per_request_us(
    client: h2.connection.H2Connection,
    outbound: Callable[[Sequence[tuple[bytes, bytes]]], Sequence[tuple[bytes, bytes]]],
    requests: int,
    token: bytes,
    watches: int,
) -> float:
    server = paired_with(client)
    for n in range(watches):
        stream_id = client.get_next_available_stream_id()
        client.send_headers(stream_id, outbound(request(n, token)), end_stream=True)
        server.receive_data(client.data_to_send())
        server.send_headers(stream_id, answer_headers())
        client.receive_data(server.data_to_send())
    spent = 0.0
    for n in range(requests):
        headers = request(n, token)
        started = time.perf_counter()
        stream_id = client.get_next_available_stream_id()
        client.send_headers(stream_id, outbound(headers), end_stream=True)
        sent = client.data_to_send()
        spent += time.perf_counter() - started
        server.receive_data(sent)
        server.send_headers(stream_id, answer_headers())
        server.send_data(stream_id, BODY, end_stream=True)
        answer = server.data_to_send()
        started = time.perf_counter()
        for event in client.receive_data(answer):
            if isinstance(event, h2.events.DataReceived):
                client.acknowledge_received_data(event.flow_controlled_length, stream_id)
        back = client.data_to_send()
        spent += time.perf_counter() - started
        server.receive_data(back)
    return spent / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--watches", type=int, default=0)
    args = parser.parse_args()
    print(
        f"h2 and hpack per request ({args.requests} requests beside {args.watches} watches,"
        f" median of {args.rounds} rounds)"
    )
    for what, token in (("a service account's token", TOKEN), ("a client certificate", b"")):
        baseline: list[float] = []
        fusevol: list[float] = []
        for _ in range(args.rounds):  # alternated: both see the machine's same moments
            baseline.append(per_request_us(h2_defaults(), list, args.requests, token, args.watches))
            fusevol.append(
                per_request_us(new_state(), outbound, args.requests, token, args.watches)
            )
        b, f = statistics.median(baseline), statistics.median(fusevol)
        print(f"  with {what}:")
        print(f"    h2's defaults (baseline)   {b:6.1f} us")
        print(f"    fusevol's new_state()      {f:6.1f} us   {f / b:.2f}x the baseline")


if __name__ == "__main__":
    main()
