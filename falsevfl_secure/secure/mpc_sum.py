"""The secure sum of the `mpc` protocol: pairwise-masked fixed-point shares, revealed to one party.

Every party encodes its contribution on CrypTen's ring (`secure.fixed_point`), adds its zero share
(`secure.masks`: pairwise AES-CTR masks from X25519 keys that cancel over all parties) and sends the
result to `dst` alone, which adds the K messages and decodes the sum. `dst` sees each other party's
message masked by keys it does not hold; unmasking one party takes every other party together.

An out-of-range or non-finite input must not leave the others hanging in the gather, so every message
carries one extra masked element, an error flag: a party with bad input contributes zeros and flag 1
and raises after the gather; `dst` raises when the revealed flag count is non-zero.
"""

from __future__ import annotations

import secrets
from typing import NamedTuple, Protocol

import numpy as np
import torch

from .errors import SecureMessageError, SecureRangeError
from .fixed_point import PRECISION_BITS, decode_fixed_point, encode_fixed_point
from .masks import ZeroShares

__all__ = ["RankedLinks", "ReceivedShare", "masked_message", "open_total", "secure_sum", "share_of"]


class RankedLinks(Protocol):
    """What a secure sum needs of its transport: this party's rank among `size`, and byte frames to and
    from a rank (`network.peers.Peers` realises it over the authenticated links)."""

    rank: int
    size: int

    def send(self, dst: int, tag: str, payload: bytes) -> None: ...

    def recv(self, src: int, tag: str) -> bytes: ...


class ReceivedShare(NamedTuple):
    """One message `dst` received: `src`'s masked int64 share of the value (row-major) and, last, of the flag."""

    src: int
    raw: torch.Tensor


def masked_message(value: torch.Tensor, shares: ZeroShares, n_addends: int, limit: float | None,
                   precision_bits: int = PRECISION_BITS):
    """This party's message and its own range error (None when the value was encoded). `limit` bounds |value|
    (None: what the ring carries for `n_addends` addends); `precision_bits`, the grid, is the protocol's."""
    numel = value.numel()
    message = shares.take(numel + 1)
    try:
        message[:numel] += encode_fixed_point(value, precision_bits, n_addends, limit).reshape(-1)
    except SecureRangeError as error:
        message[numel] += 1
        # value slots of uniform secret noise: left at zero, the masks still cancelled, and the total was the exact
        # sum of the other parties' values, the other party's own at K = 3 (review finding)
        message[:numel] += torch.from_numpy(np.frombuffer(secrets.token_bytes(8 * numel), dtype="<i8").copy())
        return message, error
    return message, None


def share_of(payload: bytes, numel: int, src: int) -> torch.Tensor:
    """A received share: exactly numel + 1 little-endian int64 ring elements."""
    if len(payload) != 8 * (numel + 1):
        raise SecureMessageError(f"the share from rank {src} has {len(payload)} bytes, expected {8 * (numel + 1)}")
    return torch.from_numpy(np.frombuffer(payload, dtype="<i8").astype(np.int64))


def secure_sum(value: torch.Tensor, dst: int, shares: ZeroShares, peers: RankedLinks, *, tag: str = "sum",
               limit: float | None = None, view: list[ReceivedShare] | None = None) -> torch.Tensor | None:
    """Sum `value` over every rank of `peers`; the sum (float64) on `dst`, None elsewhere.

    Every rank calls this with a tensor of the same shape (the shape is public and checked by the typed
    round that carries it). Each addend is rounded to the nearest multiple of 2^-16, so the result is the
    exact sum of the encodings. `limit` bounds |value| (default: what the ring carries). `view`, on `dst`,
    receives every message it got. Raises `SecureRangeError` on the rank whose input was refused and on
    `dst` whenever any input was refused (without saying whose value or how large); nobody is left waiting.
    """
    if not torch.is_tensor(value) or not value.is_floating_point():
        raise TypeError(f"value must be a floating-point tensor, got {getattr(value, 'dtype', type(value))}")
    alive = getattr(peers, "alive", range(peers.size))  # a run that lost a party sums over the others
    message, own_error = masked_message(value, shares, len(alive), limit)
    if peers.rank != dst:
        peers.send(dst, tag, message.numpy().astype("<i8", copy=False).tobytes())
        if own_error is not None:
            raise own_error
        return None
    total = message.clone()
    for src in alive:
        if src != peers.rank:
            raw = share_of(peers.recv(src, tag), value.numel(), src)
            total += raw
            if view is not None:
                view.append(ReceivedShare(src, raw))
    if own_error is not None:
        raise own_error
    return open_total(total, peers.size).reshape(value.shape)


def open_total(total: torch.Tensor, parties: int, precision_bits: int = PRECISION_BITS) -> torch.Tensor:
    """The decoded sum (float64, flat) from the sum of every party's message; refused when an input was."""
    refused = int(total[-1])
    if not 0 <= refused <= parties:
        raise SecureMessageError(f"the secure sum's check element came out as {refused}: the masks do not cancel "
                                 "(a party's message was altered, replayed or of another step, or the parties did not "
                                 "agree the same pair keys; additive masks cannot tell which party)")
    if refused:
        raise SecureRangeError(f"the input of {refused} part{'y' if refused == 1 else 'ies'} was non-finite or "
                               "outside the secure sum's range (see those parties' own errors)")
    return decode_fixed_point(total[:-1], precision_bits)
