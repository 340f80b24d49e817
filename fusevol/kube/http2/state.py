"""h2's state machine of one client connection, as the agent sets it up (`new_state`): Go's
windows, no server push, closed streams forgotten at once and a bounded record of resets
(`_State`), and its headers coded for speed (`_Encoder`, `outbound`).

h2 is sans-IO: this is the protocol's state only; the socket, the tasks that feed it and what
waits on it are `connection`'s. Excludes: the connection window (`connection` raises it once
the connection is made), the stream limit the pool keeps to (`Connection.has_room`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import h2.config
import h2.connection
import h2.settings
import h2.stream
import hpack

if TYPE_CHECKING:
    from collections.abc import Sequence

# hpack logs every header it encodes or decodes at DEBUG: at the agent's debug level, thousands of
# lines a second while watches open, for nothing the agent's own lines do not say.
logging.getLogger("hpack").setLevel(logging.INFO)

STREAM_WINDOW = 4 << 20
"""Go's transportDefaultStreamFlow."""
CLOSED_STREAMS_KEPT = 512
"""How many of its closed streams a connection remembers (`_State`): twice the streams
kube-apiserver lets a connection have open at once."""

Header = tuple[bytes, bytes]


def new_state() -> _State:
    """The HTTP/2 state machine of one client connection, as the agent sets it up: Go's windows,
    no server push, closed streams forgotten at once and a bounded record of resets (`_State`),
    and its headers coded for speed (`_Encoder`, `outbound`). The agent's own headers are
    well-formed and lower-case, and of the server's it reads `:status` only, so h2 neither
    checks nor normalizes them. h2's time per request, `bench/h2_cost.py`: 0.28x that of h2's
    defaults with a service account's token, 0.66x without one."""
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
    )
    state = _State(config)
    state.encoder = _Encoder()
    state.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20,
        },
    )
    return state


class _State(h2.connection.H2Connection):
    """h2's state of a connection, which forgets a stream as soon as its response is done with
    (`forget`), and remembers only its last `CLOSED_STREAMS_KEPT` resets, not h2's 65536 closed
    streams.

    h2 keeps how each closed stream was closed, so that the answer to a stream the agent reset
    (a watch no longer wanted, a request given up), its headers already on their way, is
    ignored and does not end the connection as a protocol error. Every closed stream stays, up to
    65536 a connection, about 140 bytes each (a connection's Python heap grew 150 bytes a stream
    closed over 10000 requests, 9 with this bound): a connection of 250 watches, each ended by
    the server every 5-10 minutes and watched again on a new stream, closes some 2000 streams
    an hour, so the record would reach 9 MiB a connection after a day and a half, 220 MiB for
    the 25 connections of 6000 watches. Only a frame that crossed a reset needs the record (a
    late frame of a stream that ended is the server's protocol error, remembered or not): it
    comes within a round trip, and a connection has at most the server's
    `SETTINGS_MAX_CONCURRENT_STREAMS` streams (250 by kube-apiserver's default) to reset at
    once. Go's transport keeps no record at all: it ignores the frames of any stream below its
    next id. On a server that allows a connection more than 512 streams, a late frame of one
    reset among more than 512 at once ends the connection instead; its watches resume from
    their resourceVersion on a new one."""

    MAX_CLOSED_STREAMS = CLOSED_STREAMS_KEPT
    _count_at = 0
    """How many streams h2 may hold (open, and closed but not yet forgotten) before
    `open_outbound_streams` counts them again."""

    def forget(self, stream_id: int) -> None:
        """Drop a stream that is closed, at once: h2 itself drops closed streams only as it counts
        the open ones, and until then each holds its state (about 500 bytes: the stream, its
        state machine, its window), for a connection of watches as many as it has watches
        (`open_outbound_streams`). A reset is remembered, as h2 would (above)."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.closed:
            return
        del self.streams[stream_id]
        if stream.closed_by in _RESETS:
            self._closed_streams[stream_id] = stream.closed_by

    @property
    def open_outbound_streams(self) -> int:
        """What h2 asks before it opens a stream, to check the server's limit. h2 counts every
        stream of the connection for it, 250 and more on a connection of watches, and forgets the
        closed ones as it counts: 3-4 % of the agent's time while its watches start. The pool
        keeps to the limit itself (`Connection.has_room`, from its own count), so here the count,
        and the forgetting, is made only once the streams held have doubled since the last one;
        h2's check is told 0 in between. Closed streams the pool has not forgotten (`forget`)
        are then as many as the open ones at most, and a count costs a walk for every stream
        opened since the last."""
        if len(self.streams) < self._count_at:
            return 0
        open_streams: int = super().open_outbound_streams  # counts, and forgets closed streams
        self._count_at = 2 * len(self.streams) + 16
        return open_streams


_RESETS = (h2.stream.StreamClosedBy.RECV_RST_STREAM, h2.stream.StreamClosedBy.SEND_RST_STREAM)


def outbound(headers: Sequence[Header]) -> list[Header]:
    """A request's headers for `new_state`'s encoder: the path, new in every request, is never
    indexed, so that it does not push the headers that repeat out of HPACK's dynamic table."""
    return [hpack.NeverIndexedHeaderTuple(*h) if h[0] == b":path" else h for h in headers]


class _Encoder(hpack.Encoder):
    """HPACK for a client whose HPACK is pure Python:

    - No Huffman coding (Go's encoder takes it when shorter; here it costs more time than the
      bytes it saves): the headers that repeat go once per connection, then as an index into the
      dynamic table; what goes whole, the path, is a quarter longer.
    - `authorization` indexed, as Go's client does (golang.org/x/net/http2 writes every header
      field without `Sensitive`), not sent whole in every request: a service account's token is
      a kilobyte. h2 would mark it never-indexed, against compression oracles; but HPACK matches
      whole values only, never a guessed prefix of one.
    """

    def encode(self, headers: Any, huffman: bool = True) -> bytes:  # hpack's own type, passed on
        return super().encode(headers, huffman=False)
