"""The transport of the loopback API server (`tests.helpers.apiserver`): HTTP/2 over TLS, as
kube-apiserver serves it, on trio in a thread of its own.

What kube-apiserver's Go HTTP/2 server does that a client can notice, and nothing more: TLS with
ALPN `h2` (a client that does not offer h2 is refused: the agent must not fall back to a
connection per request), a `SETTINGS_MAX_CONCURRENT_STREAMS` (kube-apiserver's default: 250; a
client that opens more on one connection is a protocol error here, where Go's server would refuse
the stream), flow control both ways, PING answered, RST_STREAM from the client ending its
request's handler. Each request is handed to `handle(request)` (a coroutine of the API server)
once its body has come; it answers through the `ServerStream`.

The server counts what the tests assert on: connections accepted, open, and the most streams
open at once on one connection.

The TLS material is made once per test process by openssl(1): a CA and a serving certificate for
127.0.0.1 (`certificates()`); kubeconfigs carry the CA. As kube-apiserver's `--client-ca-file`,
the server asks for a client certificate and, if one signed by that CA is sent, the stream
carries its subject (`ServerStream.client_subject`: CN the user, O the groups, as kube's x509
authenticator reads it); `Certificates.client(cn, orgs)` issues one (a kubelet's client
certificate: certificate and key in one PEM file).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import shutil
import ssl
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

DEFAULT_MAX_STREAMS = 250
"""kube-apiserver's (k8s.io/apiserver secure_serving.go: `--http2-max-streams-per-connection`
unset)."""


def paired_with(client: h2.connection.H2Connection) -> h2.connection.H2Connection:
    """A server's state machine for `client`'s, their prefaces and SETTINGS exchanged in memory
    (no socket): what is sent on either is handed to the other by the caller. It allows
    kube-apiserver's default of streams at once (`DEFAULT_MAX_STREAMS`)."""
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    server.local_settings = h2.settings.Settings(
        client=False,
        initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: DEFAULT_MAX_STREAMS},
    )
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return server


@dataclass(frozen=True)
class Certificates:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_data(self) -> str:
        return base64.b64encode(self.ca.read_bytes()).decode()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.directory / "server.crt", self.directory / "server.key")
        context.load_verify_locations(self.ca)
        context.verify_mode = ssl.CERT_OPTIONAL
        context.set_alpn_protocols(["h2"])
        return context

    def client(self, cn: str, orgs: tuple[str, ...] = (), *, name: str = "") -> Path:
        """A client certificate for `cn` in groups `orgs`, signed by the CA: one PEM file
        holding certificate and key (kubelet's `kubelet-client-current.pem`)."""
        name = name or f"client-{abs(hash((cn, orgs))):x}"
        subject = "".join(f"/O={org}" for org in orgs) + f"/CN={cn}"
        _openssl(self.directory, "req", *_EC, "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr")  # fmt: skip
        (self.directory / f"{name}.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=clientAuth\n"
        )
        _openssl(
            self.directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt",
            "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
            "-out", f"{name}.crt",
        )  # fmt: skip
        pem = self.directory / f"{name}.pem"
        pem.write_bytes(
            (self.directory / f"{name}.crt").read_bytes()
            + (self.directory / f"{name}.key").read_bytes()
        )
        return pem


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


@functools.cache
def certificates() -> Certificates:
    """A CA and a certificate it signed for 127.0.0.1, made once per test process."""
    directory = Path(tempfile.mkdtemp(prefix="fusevol-test-apiserver-"))
    atexit.register(shutil.rmtree, directory, True)

    def openssl(*args: str) -> None:
        _openssl(directory, *args)

    ec = _EC
    openssl(
        "req", "-x509", *ec, "-days", "2", "-subj", "/CN=fusevol-test-ca",
        "-keyout", "ca.key", "-out", "ca.crt",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    openssl("req", *ec, "-subj", "/CN=kube-apiserver", "-keyout", "server.key", "-out", "s.csr")
    (directory / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "authorityKeyIdentifier=keyid\n"
    )
    openssl(
        "x509", "-req", "-in", "s.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "server.ext", "-out", "server.crt",
    )  # fmt: skip
    return Certificates(directory)


@dataclass(eq=False)
class ServerStream:
    """One request, and its answer being written."""

    connection: _Connection
    id: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    closed: bool = False
    """The client reset the stream, or the connection is gone."""

    @property
    def client_subject(self) -> tuple[str, tuple[str, ...]] | None:
        """(CN, the O's) of the client certificate the connection presented, if any."""
        return self.connection.client_subject

    async def respond(self, status: int, headers: dict[str, str]) -> None:
        pairs = [(":status", str(status)), *headers.items()]
        await self.connection.send_headers(self, pairs)

    async def send(self, data: bytes, *, end: bool = False) -> None:
        await self.connection.send_data(self, data, end=end)

    async def reset(self) -> None:
        """RST_STREAM INTERNAL_ERROR: the answer dies where it is."""
        await self.connection.reset(self)


class _Connection:
    def __init__(self, server: H2Server, stream: trio.abc.Stream, nursery: trio.Nursery) -> None:
        self._server = server
        self._stream = stream
        self._nursery = nursery
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self._h2 = h2.connection.H2Connection(config)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: server.max_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20,
            },
        )
        self._streams: dict[int, ServerStream] = {}
        self._send_lock = trio.Lock()
        self._window = trio.Event()
        self.closed = False
        self.client_subject: tuple[str, tuple[str, ...]] | None = None

    async def serve(self) -> None:
        self._h2.initiate_connection()
        await self._flush()
        try:
            while True:
                data = await self._stream.receive_some(65536)
                if not data:
                    return
                for event in self._h2.receive_data(data):
                    self._dispatch(event)
                await self._flush()
        finally:
            self.closed = True
            for stream in self._streams.values():
                stream.closed = True
            self._window.set()
            self._server.wake()

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            headers = {_text(k): _text(v) for k, v in event.headers or ()}
            request = ServerStream(
                self, event.stream_id, headers[":method"], headers[":path"], headers
            )
            self._streams[event.stream_id] = request
            self._server.stream_opened(len(self._streams))
        elif isinstance(event, h2.events.DataReceived):
            if (receiving := self._streams.get(event.stream_id)) is not None:
                receiving.body += event.data or b""
            self._h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            if (complete := self._streams.get(event.stream_id)) is not None:
                self._nursery.start_soon(self._handle, complete)
        elif isinstance(event, h2.events.StreamReset):
            if (reset := self._streams.pop(event.stream_id, None)) is not None:
                reset.closed = True
                self._server.wake()
        elif isinstance(event, h2.events.WindowUpdated):
            self._window.set()
            self._window = trio.Event()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True

    async def _handle(self, stream: ServerStream) -> None:
        try:
            await self._server.handle(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h2.exceptions.H2Error):
            pass  # the client went away meanwhile
        finally:
            self._streams.pop(stream.id, None)

    async def send_headers(self, stream: ServerStream, headers: list[tuple[str, str]]) -> None:
        if not stream.closed:
            self._h2.send_headers(stream.id, headers)
            await self._flush()

    async def send_data(self, stream: ServerStream, data: bytes, *, end: bool) -> None:
        view = memoryview(data)
        while view and not stream.closed:
            room = min(
                self._h2.local_flow_control_window(stream.id), self._h2.max_outbound_frame_size
            )
            if room <= 0:
                await self._window.wait()
                continue
            chunk, view = view[:room], view[room:]
            self._h2.send_data(stream.id, bytes(chunk), end_stream=end and not view)
            if end and not view:
                self._streams.pop(stream.id, None)  # closed for h2 once both sides ended
            await self._flush()
        if end and not data and not stream.closed:
            self._h2.end_stream(stream.id)
            self._streams.pop(stream.id, None)
            await self._flush()

    async def reset(self, stream: ServerStream) -> None:
        if not stream.closed:
            stream.closed = True
            self._h2.reset_stream(stream.id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            self._streams.pop(stream.id, None)
            await self._flush()

    async def _flush(self) -> None:
        async with self._send_lock:
            if data := self._h2.data_to_send():
                await self._stream.send_all(data)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class H2Server:
    """Serves `handle` on 127.0.0.1:`port` (0: any) in a thread of its own running trio."""

    def __init__(
        self,
        handle: Callable[[ServerStream], Awaitable[None]],
        *,
        port: int = 0,
        max_streams: int = DEFAULT_MAX_STREAMS,
        refuse: Callable[[], bool] = lambda: False,
    ) -> None:
        """`refuse()` True: a new connection is closed at once, unread (the "drop" fault)."""
        self.handle = handle
        self.max_streams = max_streams
        self._refuse = refuse
        self.port = port
        self.accepted = 0
        self.refused = 0
        self.max_streams_seen = 0
        self.protocol_errors: list[str] = []
        self._connections: dict[_Connection, trio.CancelScope] = {}
        self._changed = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._thread: threading.Thread | None = None

    # -- from any thread ---------------------------------------------------------------------------

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=trio.run, args=(self._run, ready), daemon=True, name="apiserver"
        )
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Close the listener and every connection at once (no GOAWAY: a killed server)."""
        if self._token is not None and self._cancel is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._cancel.cancel)
        if self._thread is not None:
            self._thread.join()
        self._thread = self._token = self._cancel = None

    def notify(self) -> None:
        """The world changed: every waiting handler looks again (`wait_change`)."""
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self.wake)

    def drop_connections(self) -> None:
        """Reset every open connection."""
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._drop_all)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # -- on the server's trio thread ---------------------------------------------------------------

    def wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_change(self, timeout_s: float) -> None:
        """Until `notify()`/`wake()` or `timeout_s`. A notification is a callback of this thread,
        so none comes between a handler's look at the world and this call."""
        changed = self._changed
        with trio.move_on_after(max(0.0, timeout_s)):
            await changed.wait()

    def stream_opened(self, streams: int) -> None:
        self.max_streams_seen = max(self.max_streams_seen, streams)

    def _drop_all(self) -> None:
        for scope in self._connections.values():
            scope.cancel()

    async def _run(self, ready: threading.Event) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._changed = trio.Event()
        context = certificates().server_context()
        try:
            with trio.CancelScope() as self._cancel:
                listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
                self.port = listeners[0].socket.getsockname()[1]
                ready.set()
                async with trio.open_nursery() as nursery:
                    for listener in listeners:
                        nursery.start_soon(self._accept, listener, context, nursery)
        finally:
            ready.set()

    async def _accept(
        self, listener: trio.SocketListener, context: ssl.SSLContext, nursery: trio.Nursery
    ) -> None:
        async with listener:
            while True:
                tcp = await listener.accept()
                self.accepted += 1
                if self._refuse():
                    self.refused += 1
                    await trio.aclose_forcefully(tcp)
                    continue
                nursery.start_soon(self._serve, tcp, context)

    async def _serve(self, tcp: trio.SocketStream, context: ssl.SSLContext) -> None:
        stream = trio.SSLStream(tcp, context, server_side=True)
        try:
            async with trio.open_nursery() as nursery:
                connection = _Connection(self, stream, nursery)
                with trio.CancelScope() as scope:
                    self._connections[connection] = scope
                    try:
                        await stream.do_handshake()
                        connection.client_subject = _subject(stream.getpeercert())
                        await connection.serve()
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    except h2.exceptions.ProtocolError as exc:
                        # Go's server refuses a stream over the limit; here the connection goes,
                        # and the tests assert that it never happens.
                        self.protocol_errors.append(repr(exc))
                    finally:
                        del self._connections[connection]
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


def _subject(certificate: dict[str, Any] | None) -> tuple[str, tuple[str, ...]] | None:
    """(CN, O's) of a verified peer certificate (`SSLSocket.getpeercert()`), None without one."""
    if not certificate:
        return None
    pairs = [pair for rdn in certificate.get("subject", ()) for pair in rdn]
    cn = next((value for key, value in pairs if key == "commonName"), "")
    return cn, tuple(value for key, value in pairs if key == "organizationName")
