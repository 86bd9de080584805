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

from typing import NamedTuple

import torch
import torch.distributed as dist

from .errors import SecureRangeError
from .fixed_point import decode_fixed_point, encode_fixed_point
from .masks import ZeroShares

__all__ = ["ReceivedShare", "secure_sum"]


class ReceivedShare(NamedTuple):
    """One message `dst` received: `src`'s masked int64 share of the value (row-major) and, last, of the flag."""

    src: int
    raw: torch.Tensor


def _masked_message(value: torch.Tensor, shares: ZeroShares, n_addends: int, limit: float | None):
    """This party's message and its own range error (None when the value was encoded)."""
    numel = value.numel()
    message = shares.take(numel + 1)
    try:
        message[:numel] += encode_fixed_point(value, n_addends=n_addends, limit=limit).reshape(-1)
    except SecureRangeError as error:
        message[numel] += 1
        return message, error
    return message, None


def secure_sum(value: torch.Tensor, dst: int, shares: ZeroShares, *, group=None, limit: float | None = None,
               view: list[ReceivedShare] | None = None) -> torch.Tensor | None:
    """Sum `value` over every rank of `group`; the sum (float64) on `dst`, None elsewhere.

    Every rank calls this collectively with a tensor of the same shape (the shape is public and checked
    by the typed round that carries it); the ranks of `group` are its members' global ranks. Each addend
    is rounded to the nearest multiple of 2^-16, so the result is the exact sum of the encodings. `limit`
    bounds |value| (default: what the ring carries).
    `view`, on `dst`, receives every message it got. Raises `SecureRangeError` on the rank whose input
    was refused and on `dst` whenever any input was refused; no rank is left waiting.
    """
    if not torch.is_tensor(value) or not value.is_floating_point():
        raise TypeError(f"value must be a floating-point tensor, got {getattr(value, 'dtype', type(value))}")
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    message, own_error = _masked_message(value, shares, world_size, limit)
    if rank != dst:
        dist.gather(message, None, dst=dst, group=group)
        if own_error is not None:
            raise own_error
        return None
    received = [torch.empty_like(message) for _ in range(world_size)]
    dist.gather(message, received, dst=dst, group=group)
    total = message.clone()
    for src, raw in enumerate(received):
        if src != rank:
            total += raw
            if view is not None:
                view.append(ReceivedShare(src, raw))
    if own_error is not None:
        raise own_error
    refused = int(total[-1])
    if refused:
        raise SecureRangeError(f"the input of {refused} part{'y' if refused == 1 else 'ies'} was non-finite or "
                               "outside the secure sum's range (see those parties' errors)")
    return decode_fixed_point(total[:-1]).reshape(value.shape)
