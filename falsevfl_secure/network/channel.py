"""Point-to-point byte frames between the parties of a run (the private record alignment uses them).

`PairChannel` realises `secure.channel.Channel` (ranks 0..K-1, `send`/`recv`/`exchange` of opaque byte
frames) over the run's authenticated links. A frame to or from the active party travels on that party's
own TLS link. A frame between two passive parties has no direct link (a passive party opens no port): it
travels through the active party's hub, sealed end to end with AES-256-GCM under a key of the pair's own
(derived from the session's signed X25519 exchange, `transport.handshake.pair_keys`, then per tag by HKDF),
with the sender, receiver and tag as associated data and a counter nonce per direction.

The counters belong to the key, not to the channel object: every channel a process builds from the same
pair key and tag continues one count per direction (`_COUNTS`), so a second channel of a session never
reuses a (key, nonce) pair, and a frame of an earlier channel replayed into a later one is refused. The
relay therefore sees only the frame's length; it can neither read a frame nor alter, replay, reorder or
redirect one unnoticed.
"""

from __future__ import annotations

import hashlib
import struct
import threading

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..secure.channel import Channel
from ..secure.errors import SecureMessageError
from .peers import Peers
from .wire import MAX_FRAME_BYTES

__all__ = ["MAX_FRAME_BYTES", "Channel", "FrameTooLargeError", "PairChannel", "frame_key"]

_NONCE = struct.Struct(">IQ")  # sender rank, frame counter of that direction under that key
# The last counter of each (key, direction) in this process, by a one-way label of the key: shared by every
# channel built from the key, so counters never restart while the key lives (keys are per session).
_COUNTS: dict[bytes, int] = {}
_COUNTS_LOCK = threading.Lock()


class FrameTooLargeError(SecureMessageError):
    """A peer sent (or a caller tried to send) a frame longer than the channel's bound."""


def frame_key(pair_key: bytes, tag: str) -> bytes:
    """The AES-256-GCM key of one tag's frames: frames of different tags never share a key."""
    info = b"falsevfl/pair-frames/v1\0" + tag.encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(pair_key)


def _label(key: bytes, way: str, sender: int, receiver: int) -> bytes:
    """Where the counter of one direction under `key` is kept (a hash: the table holds no key)."""
    return hashlib.sha256(b"falsevfl/pair-nonce/v1\0" + key + f"{way}:{sender}:{receiver}".encode()).digest()


class PairChannel:
    """`Channel` among the parties of a run; `keys` maps every other party's rank to this pair's key."""

    def __init__(self, peers: Peers, keys: dict[int, bytes], tag: str = "align",
                 max_frame: int = MAX_FRAME_BYTES) -> None:
        self.peers, self.tag, self.max_frame = peers, tag, int(max_frame)
        self.rank, self.world_size = peers.rank, peers.n_parties
        self._keys = {peer: frame_key(key, tag) for peer, key in keys.items()}
        self._aead = {peer: AESGCM(key) for peer, key in self._keys.items()}
        self._counts = _COUNTS  # bound to the key: every channel of this key continues the same count
        self.bytes_sent = self.bytes_received = 0

    def _relayed(self, peer: int) -> bool:
        return self.peers.active_index not in (self.rank, peer)

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise SecureMessageError(f"rank {self.rank}: no channel to rank {peer} (world size {self.world_size})")

    def _nonce(self, peer: int, way: str) -> bytes:
        """The next nonce of one direction with `peer` ("send": ours to it, "recv": its to us)."""
        sender, receiver = (self.rank, peer) if way == "send" else (peer, self.rank)
        label = _label(self._keys[peer], way, sender, receiver)
        with _COUNTS_LOCK:
            count = self._counts[label] = self._counts.get(label, -1) + 1
        return _NONCE.pack(sender, count)

    def send(self, dst: int, payload: bytes) -> None:
        self._check_peer(dst)
        if not isinstance(payload, bytes | bytearray):
            raise SecureMessageError(f"a frame must be bytes, got {type(payload).__name__}")
        if len(payload) > self.max_frame:
            raise FrameTooLargeError(f"frame of {len(payload)} bytes exceeds the bound of {self.max_frame} bytes")
        if self._relayed(dst):
            payload = self._aead[dst].encrypt(self._nonce(dst, "send"), bytes(payload), self._ad(self.rank, dst))
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
        try:
            return self._aead[src].decrypt(self._nonce(src, "recv"), frame, self._ad(src, self.rank))
        except InvalidTag:  # an honest sender seals it whole and an honest relay passes it on: one of the two did not
            names = self.peers.names
            raise SecureMessageError(f"the {self.tag} frame {names[src]!r} sealed for {names[self.rank]!r} failed its "
                                     f"integrity check: {names[src]!r} sent it so, or the relay "
                                     f"{names[self.peers.active_index]!r} altered, replayed, reordered or redirected "
                                     "it (this party cannot tell which)") from None

    def exchange(self, dst: int, payload: bytes, src: int) -> bytes:
        """Send to `dst`, then receive from `src` (sends never block, so a ring cannot deadlock)."""
        self.send(dst, payload)
        return self.recv(src)

    def _ad(self, sender: int, receiver: int) -> bytes:
        return f"falsevfl/pair/{self.tag}/{self.peers.names[sender]}->{self.peers.names[receiver]}".encode()
