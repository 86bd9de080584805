"""Point-to-point byte frames between the parties of a run (the private record alignment uses them).

`PairChannel` realises `secure.channel.Channel` (ranks 0..K-1, `send`/`recv`/`exchange` of opaque byte
frames) over the run's authenticated links. A frame to or from the active party travels on that party's
own TLS link. A frame between two passive parties has no direct link (a passive party opens no port): it
travels through the active party's hub, sealed end to end with AES-256-GCM under the pair's channel key
(derived from the session's signed X25519 exchange, `transport.handshake.pair_keys`), with a counter nonce
per direction and the sender, receiver and step as associated data. The relay therefore sees only the
frame's length; it can neither read it nor alter, replay or redirect it unnoticed.
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..secure.channel import Channel
from ..secure.errors import SecureMessageError
from .distributed import Peers
from .wire import MAX_FRAME_BYTES

__all__ = ["MAX_FRAME_BYTES", "Channel", "FrameTooLargeError", "PairChannel"]

_NONCE = struct.Struct(">IQ")  # sender rank, frame counter of that direction


class FrameTooLargeError(SecureMessageError):
    """A peer sent (or a caller tried to send) a frame longer than the channel's bound."""


class PairChannel:
    """`Channel` among the parties of a run; `keys` maps every other party's rank to this pair's key."""

    def __init__(self, peers: Peers, keys: dict[int, bytes], tag: str = "align",
                 max_frame: int = MAX_FRAME_BYTES) -> None:
        self.peers, self.tag, self.max_frame = peers, tag, int(max_frame)
        self.rank, self.world_size = peers.rank, peers.n_parties
        self._aead = {peer: AESGCM(key) for peer, key in keys.items()}
        self._sent: dict[int, int] = {}
        self._received: dict[int, int] = {}
        self.bytes_sent = self.bytes_received = 0

    def _relayed(self, peer: int) -> bool:
        return self.peers.active_index not in (self.rank, peer)

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise SecureMessageError(f"rank {self.rank}: no channel to rank {peer} (world size {self.world_size})")

    def send(self, dst: int, payload: bytes) -> None:
        self._check_peer(dst)
        if not isinstance(payload, bytes | bytearray):
            raise SecureMessageError(f"a frame must be bytes, got {type(payload).__name__}")
        if len(payload) > self.max_frame:
            raise FrameTooLargeError(f"frame of {len(payload)} bytes exceeds the bound of {self.max_frame} bytes")
        if self._relayed(dst):
            count = self._sent[dst] = self._sent.get(dst, -1) + 1
            payload = self._aead[dst].encrypt(_NONCE.pack(self.rank, count), bytes(payload), self._ad(self.rank, dst))
        self.peers.send(dst, self.tag, bytes(payload))
        self.bytes_sent += len(payload)

    def recv(self, src: int) -> bytes:
        self._check_peer(src)
        frame = self.peers.recv(src, self.tag)
        self.bytes_received += len(frame)
        if len(frame) > self.max_frame + 16:
            raise FrameTooLargeError(f"rank {self.rank}: rank {src} sent a frame of {len(frame)} bytes "
                                     f"(bound {self.max_frame})")
        if not self._relayed(src):
            return frame
        count = self._received[src] = self._received.get(src, -1) + 1
        try:
            return self._aead[src].decrypt(_NONCE.pack(src, count), frame, self._ad(src, self.rank))
        except InvalidTag:
            raise SecureMessageError(f"rank {self.rank}: the frame from rank {src} failed its integrity check "
                                     "(altered, replayed or redirected on the way)") from None

    def exchange(self, dst: int, payload: bytes, src: int) -> bytes:
        """Send to `dst`, then receive from `src` (sends never block, so a ring cannot deadlock)."""
        self.send(dst, payload)
        return self.recv(src)

    def _ad(self, sender: int, receiver: int) -> bytes:
        return f"falsevfl/pair/{self.tag}/{self.peers.names[sender]}->{self.peers.names[receiver]}".encode()
