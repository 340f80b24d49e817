"""The HTTP/2 pool (`fusevol.kube.http2`) on its own, against real servers on loopback: the
loopback API server's HTTP/2 layer (`tests.helpers.h2server`, TLS) and, for a peer that goes
silent, a bare h2c server that answers the preface and nothing else.

What the agent's scale rests on: streams share a connection up to the server's limit and only
then is another made; requests arriving while a connection is dialled wait for it and share its
failure (one refused dial, not one per request); a dead peer is found by PING, a live but quiet
one is not given up, an idle connection is closed; a body larger than the stream window arrives
whole; the headers that repeat (a kilobyte of token) are sent once per connection.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
import trio
from h2.stream import StreamClosedBy

from fusevol.kube.http2.errors import ConnectionLost, Unreachable
from fusevol.kube.http2.pool import REACH_BACKOFF_S, Pool
from fusevol.kube.http2.state import CLOSED_STREAMS_KEPT, new_state, outbound
from tests.helpers.h2server import DEFAULT_MAX_STREAMS, H2Server, certificates, paired_with

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.helpers.h2server import ServerStream


def headers(path: str) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"GET"),
        (b":scheme", b"https"),
        (b":authority", b"127.0.0.1"),
        (b":path", path.encode()),
    ]


async def answer(stream: ServerStream) -> None:
    """`/hold`: headers, then nothing until the client goes; `/big`: 10 MiB; else "ok"."""
    await stream.respond(200, {})
    if stream.path == "/hold":
        while not stream.closed:
            await trio.sleep(0.01)
    elif stream.path == "/big":
        await stream.send(b"x" * (10 << 20), end=True)
    else:
        await stream.send(b"ok", end=True)


@pytest.fixture
def server() -> Iterator[H2Server]:
    server = H2Server(answer, max_streams=10)
    server.start()
    yield server
    server.stop()


def pool_for(port: int) -> Pool:
    context = ssl.create_default_context(cafile=str(certificates().ca))
    context.set_alpn_protocols(["h2"])
    return Pool(host="127.0.0.1", port=port, ssl_context=context)


async def test_streams_fill_a_connection_to_the_servers_limit_before_another_is_made(
    server: H2Server,
) -> None:
    pool = pool_for(server.port)
    held = [await pool.request(headers("/hold")) for _ in range(25)]
    assert [r.status for r in held] == [200] * 25
    assert (pool.connections, pool.streams()) == (3, 25)  # 10 + 10 + 5
    assert server.max_streams_seen == 10
    for response in held[:15]:
        response.close()
    ok = await pool.request(headers("/"))  # room again on a connection that exists
    assert await ok.read() == b"ok"
    ok.close()
    assert pool.connections_made == 3
    pool.close()
    assert server.protocol_errors == []


async def test_a_stream_is_forgotten_once_its_response_is_done_with_and_a_reset_remembered(
    server: H2Server,
) -> None:
    """h2 holds a closed stream's state (some 500 bytes) until it next counts the open ones,
    which on a connection of watches comes after as many requests as it has watches: the pool
    drops each stream as its response is closed. A stream it reset is remembered (the server's
    answer may cross the reset); one that ended is not (nothing may follow its end)."""
    pool = pool_for(server.port)
    watches = [await pool.request(headers("/hold")) for _ in range(4)]
    for _ in range(30):
        ok = await pool.request(headers("/"))
        assert await ok.read() == b"ok"
        ok.close()
    (connection,) = pool._connections
    state = connection._h2
    assert sorted(state.streams) == [w.id for w in watches]
    assert dict(state._closed_streams) == {}
    watches[0].close()  # no longer wanted: reset
    assert sorted(state.streams) == [w.id for w in watches[1:]]
    assert dict(state._closed_streams) == {watches[0].id: StreamClosedBy.SEND_RST_STREAM}
    ok = await pool.request(headers("/"))  # the connection goes on
    assert await ok.read() == b"ok"
    ok.close()
    pool.close()
    assert server.protocol_errors == []


async def test_a_body_larger_than_the_stream_window_arrives_whole(server: H2Server) -> None:
    pool = pool_for(server.port)
    response = await pool.request(headers("/big"))
    assert len(await response.read()) == 10 << 20
    response.close()
    pool.close()


async def test_requests_share_one_dial_and_its_failure() -> None:
    with trio.socket.socket() as probe:  # a port nobody listens on
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pool = pool_for(port)
    failures: list[str] = []

    async def one() -> None:
        try:
            await pool.request(headers("/"))
        except ConnectionLost as exc:
            failures.append(str(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(one)
    assert len(failures) == 50
    assert pool.connections_made == 1  # one refused dial for the 50 requests


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_the_callers_of_a_failed_dial_wait_together_for_the_servers_return(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After `Unreachable`, `wait_reachable`: one task dials for every waiter, every 2 s at
    most, and they all go on once a connection is open; one line when the server went away and
    one when it is back, however many waited."""
    caplog.set_level(logging.INFO, logger="fusevol.kube.http2")
    port = free_port()
    pool = pool_for(port)
    with pytest.raises(Unreachable):
        await pool.request(headers("/"))
    reached: list[float] = []

    async def waiter() -> None:
        await pool.wait_reachable()
        reached.append(trio.current_time())

    server = H2Server(answer, port=port)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(waiter)
            await trio.sleep(3)  # away: the dials grow apart, to 2 s
            assert (reached, pool.connections) == ([], 0)
            dials_while_away = pool.connections_made - 1
            back = trio.current_time()
            await trio.to_thread.run_sync(server.start)
        assert len(reached) == 100
        assert max(reached) - back <= REACH_BACKOFF_S[1] + 1.0
        assert 3 <= dials_while_away <= 6  # 0.25 s doubling to 2 s, jittered: not a dial a waiter
        assert pool.connections == 1
        ok = await pool.request(headers("/"))  # on the connection the dialer made
        assert await ok.read() == b"ok"
        ok.close()
        assert server.accepted == 1
    finally:
        pool.close()
        server.stop()
    lines = [(r.levelname, r.getMessage().split(" server=")[0]) for r in caplog.records]
    assert lines == [
        ("WARNING", "API server unreachable, dialling until it answers"),
        ("INFO", "API server reachable again"),
    ]
    caplog.clear()


async def _answer_headers(tcp: trio.SocketStream) -> h2.connection.H2Connection:
    """A server's side of h2c up to the first request answered: SETTINGS, then the response's
    headers (status 200, the stream left open); the server's state, to go on with."""
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    await tcp.send_all(server.data_to_send())
    answered = False
    while not answered:
        for event in server.receive_data(await tcp.receive_some(65536)):
            if isinstance(event, h2.events.RequestReceived):
                server.send_headers(event.stream_id, [(":status", "200")])
                answered = True
        await tcp.send_all(server.data_to_send())
    return server


async def test_a_silent_peer_is_found_by_ping_and_its_streams_fail(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("fusevol.kube.http2.connection.READ_IDLE_S", 0.2)
    monkeypatch.setattr("fusevol.kube.http2.connection.PING_TIMEOUT_S", 0.3)

    async def silent_after_headers(tcp: trio.SocketStream) -> None:
        """h2c: SETTINGS, the response's headers, then never another byte (reads go on)."""
        await _answer_headers(tcp)
        while await tcp.receive_some(65536):
            pass  # the PING is read, never answered

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, silent_after_headers, 0)
        port = listeners[0].socket.getsockname()[1]
        pool = Pool(host="127.0.0.1", port=port, ssl_context=None)
        response = await pool.request(headers("/watch"))
        with trio.fail_after(5), pytest.raises(ConnectionLost, match="PING"):
            await response.receive()
        assert pool.connections == 0
        nursery.cancel_scope.cancel()
    assert [r.getMessage().split(" reason=")[1] for r in caplog.records] == [
        "no answer to a PING in 0.3s"
    ]
    caplog.clear()


async def test_a_quiet_connection_whose_peer_answers_its_pings_stays_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("fusevol.kube.http2.connection.READ_IDLE_S", 0.2)
    monkeypatch.setattr("fusevol.kube.http2.connection.PING_TIMEOUT_S", 0.3)
    pings = 0

    async def answers_pings_then_data(tcp: trio.SocketStream) -> None:
        """h2c: the response's headers, 1.5 s of nothing but PING answers, then its body."""
        nonlocal pings
        server = await _answer_headers(tcp)
        with trio.move_on_after(1.5):
            while data := await tcp.receive_some(65536):
                events = server.receive_data(data)
                pings += sum(isinstance(e, h2.events.PingReceived) for e in events)
                await tcp.send_all(server.data_to_send())  # h2 acknowledges a PING itself
        server.send_data(1, b"late", end_stream=True)
        await tcp.send_all(server.data_to_send())
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, answers_pings_then_data, 0)
        port = listeners[0].socket.getsockname()[1]
        pool = Pool(host="127.0.0.1", port=port, ssl_context=None)
        response = await pool.request(headers("/watch"))
        with trio.fail_after(5):
            assert await response.read() == b"late"
        response.close()
        assert pool.connections == 1
        assert 3 <= pings <= 8  # one each READ_IDLE_S of silence, answered at once
        pool.close()
        nursery.cancel_scope.cancel()


async def test_a_connection_without_streams_is_closed_once_idle(
    monkeypatch: pytest.MonkeyPatch, server: H2Server
) -> None:
    """Its PINGs answered, a connection without a stream lasts IDLE_CONNECTION_S, then goes;
    the next request makes a new one."""
    monkeypatch.setattr("fusevol.kube.http2.connection.READ_IDLE_S", 0.1)
    monkeypatch.setattr("fusevol.kube.http2.connection.IDLE_CONNECTION_S", 0.5)
    pool = pool_for(server.port)
    try:
        ok = await pool.request(headers("/"))
        assert await ok.read() == b"ok"
        ok.close()
        await trio.sleep(0.3)
        assert pool.connections == 1  # answering PINGs, not idle long enough
        with trio.fail_after(5):
            while pool.connections:
                await trio.sleep(0.05)
        again = await pool.request(headers("/"))
        assert await again.read() == b"ok"
        again.close()
        assert server.accepted == 2
    finally:
        pool.close()


async def test_a_connection_reset_by_the_peer_fails_its_streams_retryably_saying_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:

    async def reset_after_headers(tcp: trio.SocketStream) -> None:
        """h2c: SETTINGS, the response's headers, then a TCP reset (SO_LINGER 0)."""
        await _answer_headers(tcp)
        tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tcp.socket.close()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, reset_after_headers, 0)
        port = listeners[0].socket.getsockname()[1]
        pool = Pool(host="127.0.0.1", port=port, ssl_context=None)
        response = await pool.request(headers("/watch"))
        with trio.fail_after(5), pytest.raises(ConnectionLost, match="connection lost") as lost:
            await response.receive()
        nursery.cancel_scope.cancel()
    assert lost.value.said  # logged once for the connection: its streams need not say it
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"http2 connection lost connection=127.0.0.1:{port}#1 streams=1")
    caplog.clear()


def test_headers_that_repeat_are_sent_once_per_connection() -> None:
    """A service account's token (a kilobyte) goes whole in the first request only, then as an
    index into HPACK's table, which the paths of the requests after it do not push it out of;
    what the server decodes is what was sent."""
    client = new_state()
    server = paired_with(client)
    token = b"Bearer " + b"t0k3n." * 170
    sizes = []
    for n in range(90):  # the paths of 25 would fill the table
        sent = [*headers(f"/api/v1/namespaces/ns/configmaps?fieldSelector=metadata.name%3Dcm-{n}")]
        sent.append((b"authorization", token))
        client.send_headers(client.get_next_available_stream_id(), outbound(sent))
        frames = client.data_to_send()
        sizes.append(len(frames))
        (event,) = (
            e for e in server.receive_data(frames) if isinstance(e, h2.events.RequestReceived)
        )
        assert [(bytes(k), bytes(v)) for k, v in event.headers] == sent
    assert sizes[0] > len(token) // 2  # the token whole, Huffman-coded or not
    assert max(sizes[1:]) < 150, sizes


def _answer(server: h2.connection.H2Connection, frames: bytes) -> bytes:
    """The server's whole answer to each request in `frames`."""
    for event in server.receive_data(frames):
        if isinstance(event, h2.events.RequestReceived):
            server.send_headers(event.stream_id, [(b":status", b"200")])
            server.send_data(event.stream_id, b"ok", end_stream=True)
    return server.data_to_send()


def _exchange(client: h2.connection.H2Connection, server: h2.connection.H2Connection) -> None:
    """One request, answered whole, its data given back to the flow-control windows."""
    client.send_headers(client.get_next_available_stream_id(), headers("/"), end_stream=True)
    for event in client.receive_data(_answer(server, client.data_to_send())):
        if isinstance(event, h2.events.DataReceived):
            client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
    server.receive_data(client.data_to_send())


def test_what_a_connection_keeps_of_its_closed_streams_does_not_grow_with_them() -> None:
    """Each watch is a new stream every 5-10 minutes: what a long-lived connection keeps of the
    streams it closed (h2's `_closed_streams`) must stay the same size however many it closes
    (h2 alone keeps 65536)."""
    client = new_state()
    server = paired_with(client)
    kept = []
    for _ in range(3):
        for _ in range(1000):
            _exchange(client, server)
        kept.append(len(client._closed_streams))
    assert kept[0] == kept[1] == kept[2] <= CLOSED_STREAMS_KEPT


def test_a_connection_of_watches_counts_its_streams_only_as_they_double() -> None:
    """Before it opens a stream h2 walks every stream of the connection (to check the server's
    limit, and to forget the closed ones): with 249 watches open, 250 steps for each request. The
    pool keeps to the limit itself, so the walk is made once the streams h2 holds have doubled,
    and the closed ones are forgotten then: no more of them are held than open ones."""
    client = new_state()
    server = paired_with(client)  # kube-apiserver's stream limit
    for n in range(DEFAULT_MAX_STREAMS - 1):
        client.send_headers(client.get_next_available_stream_id(), headers(f"/watch/{n}"))
    server.receive_data(client.data_to_send())
    walks = 0
    walk = client._open_streams

    def counted(remainder: int) -> int:
        nonlocal walks
        walks += 1
        return walk(remainder)

    client._open_streams = counted  # type: ignore[method-assign]
    held = []
    for _ in range(2000):
        _exchange(client, server)  # each its own stream, beside the watches
        held.append(len(client.streams))
    assert walks <= 2000 // DEFAULT_MAX_STREAMS + 2  # h2 alone: 2000
    assert max(held) <= 2 * DEFAULT_MAX_STREAMS + 16


def test_answers_that_crossed_the_reset_of_a_connections_every_stream_do_not_end_it() -> None:
    """What the bound must still cover: a connection's whole stream limit reset at once before
    their answers came (the node's pods deleted as their watches started), as many streams
    closed after them, and only then the response headers the server had sent before it saw the
    resets: ignored, not a protocol error that would end every other watch on the connection
    (h2 needs the record of a reset for that)."""
    client = new_state()
    server = paired_with(client)  # kube-apiserver's stream limit
    held = []
    for n in range(DEFAULT_MAX_STREAMS):
        held.append(client.get_next_available_stream_id())
        client.send_headers(held[-1], headers(f"/watch/{n}"), end_stream=True)
    for event in server.receive_data(client.data_to_send()):
        if isinstance(event, h2.events.RequestReceived):
            server.send_headers(event.stream_id, [(b":status", b"200")])
    crossing = server.data_to_send()  # on its way while the client resets
    for stream_id in held:
        client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        client.forget(stream_id)  # as the connection does when the response is closed
    server.receive_data(client.data_to_send())
    for _ in range(DEFAULT_MAX_STREAMS):
        _exchange(client, server)
    assert client.receive_data(crossing) == []  # ProtocolError if a reset was forgotten
    _exchange(client, server)  # the connection goes on
