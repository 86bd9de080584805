"""Pairwise masks for the secure sum (Bonawitz et al., CCS 2017).

Every pair of parties (i, j) agrees a key by X25519 at start-up. In each sum, party i adds to its
encoded value the zero share

    z_i = sum over j > i of PRG(k_ij) - sum over j < i of PRG(k_ij)      (mod 2^64)

and the shares of all parties cancel in the total. Removing party i's mask needs every key it shares,
so only the coalition of all other parties together can unmask it (and that coalition learns x_i from
the sum anyway). PRG(k) is AES-256-CTR (`randomness.KeyStream`); every sum consumes a fresh,
never-reused range of each pair's keystream. Keys are ephemeral: a new agreement per session.

Key derivation: HKDF-SHA256 over the X25519 shared secret, salted with the session's transcript (the
session id, the agreement and every party's signed public key, `network.handshake`), so a key belongs
to this session only, and labelled with the purpose and the pair. The public keys are signed by each
party's pinned identity: a relay that substitutes one is detected before any key is used.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..randomness import KeyStream
from .errors import SecureMessageError

PUBLIC_KEY_BYTES = 32


class X25519Agreement:
    """This party's side of the pairwise key agreement: an ephemeral X25519 key from OS entropy."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()

    def public_key(self) -> bytes:
        return self._private.public_key().public_bytes_raw()

    def pair_keys(self, rank: int, public_keys: Sequence[bytes], transcript: bytes | None = None,
                  purpose: str = "secure-sum") -> dict[int, bytes]:
        """One 32-byte key per other party for `purpose`, from everyone's public keys (index = rank).

        `transcript` binds the keys to one session (the handshake passes the hash of the session id, the
        agreement and every signed public key); without it, the hash of the public keys in rank order."""
        if any(len(key) != PUBLIC_KEY_BYTES for key in public_keys):
            raise SecureMessageError(f"an X25519 public key has {PUBLIC_KEY_BYTES} bytes")
        if public_keys[rank] != self.public_key():
            raise SecureMessageError("the exchanged public keys do not contain this party's own key")
        transcript = hashlib.sha256(b"".join(public_keys)).digest() if transcript is None else transcript
        keys = {}
        for peer, public in enumerate(public_keys):
            if peer != rank:
                try:
                    shared = self._private.exchange(X25519PublicKey.from_public_bytes(public))
                except ValueError:  # a low-order point: the shared secret would be all zeros
                    raise SecureMessageError(f"the X25519 key of rank {peer} is not a valid public key") from None
                keys[peer] = derive_pair_key(shared, transcript, rank, peer, purpose)
        return keys


def derive_pair_key(shared: bytes, transcript: bytes, a: int, b: int, purpose: str = "secure-sum") -> bytes:
    """HKDF-SHA256 of a pair's shared secret for one purpose; both sides derive the same key (the pair is
    sorted). Distinct purposes give independent keys (masks, the alignment's pair channel)."""
    low, high = sorted((a, b))
    info = f"falsevfl-{purpose}-v1:{low}:{high}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=transcript, info=info).derive(shared)


def zero_share(rank: int, streams: Mapping[int, KeyStream], n: int, scratch: np.ndarray | None = None) -> torch.Tensor:
    """The next `n` elements of this party's zero share: + streams of higher ranks, - of lower ranks.

    Each pair's next 8n keystream bytes are encrypted straight into an int64 buffer (one
    `KeyStream.read_into` per pair: the first into the share itself, the others into `scratch`, reused
    when it holds n or more values) and added on the ring (numpy's int64 arithmetic wraps, as Z_2^64 needs).
    """
    share = np.empty(n, dtype=np.int64)
    pairs = sorted(streams.items())
    if not pairs:
        share.fill(0)
    draw = scratch[:n] if scratch is not None and scratch.size >= n else np.empty(n, dtype=np.int64)
    for i, (peer, stream) in enumerate(pairs):
        stream.read_into(share if i == 0 else draw)
        if i == 0 and peer < rank:
            np.negative(share, out=share)
        elif i > 0:
            (np.add if peer > rank else np.subtract)(share, draw, out=share)
    return torch.from_numpy(share)


class ZeroShares:
    """This party's zero shares for consecutive sums, drawn ahead of need by one background thread.

    Each pair stream is a stream: drawing n + m elements gives the draws of n then m, so the next sum's
    shares can be drawn while the party waits; every party takes the same count per sum, so both ends
    of a pair stay aligned and the shares still cancel. One worker thread draws in submission order;
    after each `take` a draw of the same size is queued (`cryptography`'s AES-CTR and numpy's additions
    release the GIL while they run, so the party's own thread is not held up).
    """

    def __init__(self, rank: int, pair_keys: Mapping[int, bytes]) -> None:
        self.rank = rank
        self._streams = {peer: KeyStream(key) for peer, key in pair_keys.items()}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zero-shares")
        self._pending: deque[Future] = deque(maxlen=1)  # at most one draw ahead (`take` queues one only then)
        self._leftover: torch.Tensor | None = None
        self._scratch = np.empty(0, dtype=np.int64)  # touched by the worker thread only

    def _draw(self, n: int) -> torch.Tensor:
        """On the worker thread: the next n elements, the pair keystreams expanded into a kept scratch buffer."""
        if self._scratch.size < n:
            self._scratch = np.empty(n, dtype=np.int64)
        return zero_share(self.rank, self._streams, n, self._scratch)

    def take(self, n: int) -> torch.Tensor:
        """The next `n` elements of this party's share stream."""
        if n == 0:
            return torch.zeros(0, dtype=torch.int64)
        parts, have = [], 0
        while have < n:
            if self._leftover is None:
                if not self._pending:
                    self._pending.append(self._executor.submit(self._draw, n - have))
                self._leftover = self._pending.popleft().result()
            piece = self._leftover[: n - have]
            self._leftover = self._leftover[piece.numel():] if piece.numel() < self._leftover.numel() else None
            parts.append(piece)
            have += piece.numel()
        if not self._pending:  # one draw ahead at a time: the stream is read in order whatever the chunk sizes
            self._pending.append(self._executor.submit(self._draw, n))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def close(self) -> None:
        """Stop drawing; shares drawn ahead are dropped."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._leftover = None
