"""Authenticated gRPC links: the only sockets that cross a party boundary.

A role that serves (the active party; the he aggregator) runs a `Hub`: one gRPC server with mutual TLS
on one port, whose single bidirectional-streaming method carries `wire` envelopes. Every other role
`dial`s out to the hubs it needs, so a passive party never opens an inbound port. Both ends present a
leaf certificate issued by their pinned identity (`secure.identity.tls_material`); a hub trusts exactly
the pins of the roles that may connect to it, a dialer exactly the pin of the role it dials, so a peer
whose identity is not pinned is refused by the TLS handshake itself, before any message. Messages are
raw envelope bytes (no protobuf, no pickle), each at most `wire.MAX_MESSAGE_BYTES`.

A `Link` is one stream to one peer, seen from either end: an outbound queue (a frame's fragments are
queued together, so frames never interleave on a link) and a reader thread that hands every received
envelope to the owner's callback. What travels on a link and when is the business of `network.Network`.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from ..errors import PartyFailure
from ..secure.identity import TLS_NAME, TlsMaterial, issuer_of
from . import wire


def _fewer_arenas() -> None:
    """glibc gives threads that allocate their own heap arenas and seldom returns their memory: under a flood
    of held-back frames gRPC's threads kept about 12 MiB more resident (tests/test_operations.py). Two arenas
    (M_ARENA_MAX) bound that; not glibc: nothing to do. (A fixed mmap threshold saved ~4 MiB more there but
    made every tensor of a MiB or more a fresh mapping: a CPU step 24-27 -> 31-39 ms; not set.)"""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)
    except (OSError, AttributeError):
        pass


_fewer_arenas()
os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # gRPC's own log lines, errors too, would precede our error line
import grpc  # noqa: E402  (the variable above must be set before gRPC's first import)

METHOD = "/falsevfl.Link/Stream"
# gRPC reads ahead of a held reader up to its stream window; its bandwidth-delay probe grew that window with a
# loaded receiver (a flooded victim kept ~20 MiB more under CI load). A fixed 1 MiB window still fills 100
# Mbit/s at an 80 ms RTT, ~84 Mbit/s per link at 100 ms (bench/results/wan's links measured the same goodput).
_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1 << 20)]
_OPTIONS = [("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0), *_WINDOW]
_DIAL_OPTIONS = [*_OPTIONS, ("grpc.ssl_target_name_override", TLS_NAME),
                 ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000),
                 ("grpc.min_reconnect_backoff_ms", 200), ("grpc.enable_retries", 0)]
_CLOSE = object()

OnEnvelope = Callable[["Link", wire.Envelope], None]
OnClosed = Callable[["Link", str | None], None]


BEAT_SLACK = 64  # heartbeats a peer may send ahead of its period (Link.beat_within)


class Link:
    """One authenticated stream to `peer`; `last_seen` is when anything last arrived from it, `progress` the
    rounds it says it entered (`progressed_at`: when that last grew), `waiting_on` whom it says it waits on,
    `queued` the bytes waiting to be sent to it."""

    def __init__(self, peer: str, on_envelope: OnEnvelope, on_closed: OnClosed) -> None:
        self.peer, self._on_envelope, self._on_closed = peer, on_envelope, on_closed
        self.last_seen, self.last_round = time.monotonic(), None
        self.progress, self.progressed_at, self.waiting_on = 0, self.last_seen, None
        self.work, self.worked_at = 0, self.last_seen  # units of its own work it showed, and when the last came
        self.opened, self.beats = self.last_seen, 0
        self._outbound: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.queued = 0
        self.held = False  # its reader waits for room (this role is behind, not the peer): no stall
        self.open = True
        self.sent_all, self.ended = threading.Event(), threading.Event()  # gRPC took our last; the peer's ended

    def beat_within(self, period_s: float) -> bool:
        """Count one heartbeat; False once the peer sent more than twice one per `period_s` since the link opened,
        plus BEAT_SLACK (beats queued behind a long frame come in a burst)."""
        self.beats += 1
        return self.beats <= BEAT_SLACK + 2 * (time.monotonic() - self.opened) / period_s

    def heard(self, round: str | None, progress: int, waiting_on: str | None, work: int = 0) -> None:
        """A heartbeat: the peer's round, rounds entered, whom it waits on and units of its own work done. Both
        counts only grow on a link (a peer that flipped them, 10, 11, 10, 11, renewed its progress for ever)."""
        if progress > self.progress:
            self.progress, self.progressed_at = progress, time.monotonic()
        if work > self.work:
            self.work, self.worked_at = work, time.monotonic()
        self.last_round, self.waiting_on = round, waiting_on

    def put(self, messages: list[bytes]) -> int:
        """Queue one frame's messages back to back; the bytes queued."""
        size = sum(len(m) for m in messages)
        with self._lock:
            self.queued += size
            for message in messages:
                self._outbound.put(message)
        return size

    def outbound(self) -> Iterator[bytes]:
        while (item := self._outbound.get()) is not _CLOSE:
            with self._lock:
                self.queued -= len(item)
            yield item
        self.sent_all.set()

    def read(self, messages: Iterator[bytes]) -> None:
        """The reader thread: every message to the owner, then the reason the stream ended (None: cleanly)."""
        reason = None
        try:
            for data in messages:
                self.last_seen = time.monotonic()
                self._on_envelope(self, wire.decode(data))
        except grpc.RpcError as error:
            reason = f"{error.code().name.lower()}: {error.details()}" if hasattr(error, "code") else str(error)
        except Exception as error:  # a malformed envelope from this peer ends its link
            reason = f"{type(error).__name__}: {error}"
        self.open = False
        self.ended.set()
        self._on_closed(self, reason)

    def close(self) -> None:
        self.open = False
        self._outbound.put(_CLOSE)


class Hub:
    """A mutual-TLS gRPC server that accepts the pinned roles in `pins` (role name -> public key)."""

    def __init__(self, address: str, material: TlsMaterial, pins: dict[str, bytes], on_envelope: OnEnvelope,
                 on_closed: OnClosed, on_joined: Callable[[Link], None]) -> None:
        self.address, self.pins = address, dict(pins)
        self._on_envelope, self._on_closed, self._on_joined = on_envelope, on_closed, on_joined
        self.links: dict[str, Link] = {}
        self._lock = threading.Lock()
        workers = 2 * len(self.pins) + 4  # one per stream plus headroom; readers are threads of their own
        self._server = grpc.server(ThreadPoolExecutor(max_workers=workers), options=_OPTIONS,
                                   maximum_concurrent_rpcs=len(self.pins) + 2)
        handler = grpc.stream_stream_rpc_method_handler(self._stream)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            METHOD.split("/")[1], {METHOD.split("/")[2]: handler})])
        self.port = self.listen(address, material)
        if not self.port:
            raise PartyFailure(f"cannot listen on {address} (the address is not on this host or the port is taken)")

    def listen(self, address: str, material: TlsMaterial) -> int:
        """Bind `address` with mutual TLS (the only way the shipped build listens); the port, 0 on failure."""
        credentials = grpc.ssl_server_credentials([(material.private_key, material.certificate)],
                                                  root_certificates=material.trusted, require_client_auth=True)
        try:
            return self._server.add_secure_port(address, credentials)
        except RuntimeError:  # (this grpc raises "Failed to bind" where older ones returned 0: a traceback)
            return 0

    def peer_of(self, context) -> str | None:
        """The pinned role whose identity issued the peer's TLS certificate (None: not a pinned participant)."""
        return issuer_of(dict(context.auth_context()).get("x509_pem_cert", [b""])[0], self.pins)

    def start(self) -> Hub:
        self._server.start()
        return self

    def _stream(self, requests, context):
        peer = self.peer_of(context)
        claimed = dict(context.invocation_metadata()).get("falsevfl-role", peer)
        with self._lock:
            if peer is None or (peer in self.links and self.links[peer].open) or claimed != peer:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "not a pinned participant, or already connected")
            # (a peer whose link closed may connect again: a lost party that rejoins, runtime/losses.py)
            link = self.links[peer] = Link(peer, self._on_envelope, self._on_closed)
        self._on_joined(link)  # before its first envelope is read
        threading.Thread(target=link.read, args=(requests,), name=f"hub-read-{peer}", daemon=True).start()
        context.add_callback(link.close)  # the response loop below ends when the stream does
        yield from link.outbound()

    def stop(self, grace_s: float = 1.0) -> None:
        for link in list(self.links.values()):
            link.close()
        self._server.stop(grace_s).wait(grace_s + 1)  # the streams' last frames go out before this role exits


def secure_channel(address: str, material: TlsMaterial) -> grpc.Channel:
    """A channel that finishes its TLS handshake only with the pinned identity of `material.trusted`."""
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(
        root_certificates=material.trusted, private_key=material.private_key,
        certificate_chain=material.certificate), options=_DIAL_OPTIONS)


def dial(address: str, peer: str, material: TlsMaterial, on_envelope: OnEnvelope, on_closed: OnClosed,
         deadline: float, open_channel: Callable = secure_channel, me: str = "") -> tuple[Link, grpc.Channel]:
    """An open link to role `peer` at `address`, trying until `deadline` (time.monotonic). `me` is sent as the
    stream's metadata; the hub trusts the certificate, never this name (a name a clear test transport needs)."""
    channel = open_channel(address, material)
    try:
        grpc.channel_ready_future(channel).result(timeout=max(0.1, deadline - time.monotonic()))
    except grpc.FutureTimeoutError:
        why = _why_not_ready(channel)
        channel.close()
        raise PartyFailure(f"could not connect to {peer} at {address}: {why}") from None
    link = Link(peer, on_envelope, on_closed)
    responses = channel.stream_stream(METHOD)(link.outbound(), wait_for_ready=True, metadata=(("falsevfl-role", me),))
    threading.Thread(target=link.read, args=(responses,), name=f"dial-read-{peer}", daemon=True).start()
    return link, channel


def _why_not_ready(channel: grpc.Channel) -> str:
    """What the last connection attempt said: a refused TLS handshake (identity) or no listener."""
    try:
        channel.unary_unary(METHOD)(b"", timeout=2.0)
    except grpc.RpcError as error:
        details = (error.details() or "").lower()
        if "handshake" in details or "ssl" in details or "certificate" in details:
            return ("the TLS handshake failed: its certificate is not issued by the key pinned for it, or it does "
                    "not pin this party's key (compare the pins in both files)")
        if "socket closed" in details:
            return ("it closed the connection during the TLS handshake: it does not pin this party's key, or "
                    "takes no more connections (compare the pins in both files)")
        if "connection refused" in details:  # (a trial read the library's text alone, after a minute's wait)
            return ("nothing listens there (connection refused): it has not started within the time allowed, or "
                    "has already stopped (its own output says why)")
        return f"nothing answered ({(error.details() or '').strip()})"
    return "no connection within the time allowed"
