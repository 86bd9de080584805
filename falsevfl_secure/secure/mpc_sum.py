"""Secure sum over a CrypTen world: every rank contributes a tensor, only `dst` learns the sum.

Protocol (one round, one message per non-dst party):

1. each rank encodes its own value as 16-bit fixed point in Z_{2^64} (range-guarded for K addends);
2. it adds its share of ONE pseudo-random zero sharing (CrypTen's ``ArithmeticSharedTensor.PRZS``, drawn
   by `zero_share` from the same generators:
   ``r_{prev,me} - r_{me,next}`` from the seeds it shares with its two ring neighbours; summed over all
   K ranks the masks cancel). Its message is ``encode(value) + przs``: uniformly random to anyone who
   does not know both of its neighbour seeds;
3. the messages are gathered at `dst` only (``torch.distributed.gather`` on CrypTen's group: each
   non-dst rank sends straight to `dst`, nobody else receives anything); `dst` adds them mod 2^64 and
   decodes with the exact `decode_fixed_point`.

This is what ``crypten.cryptensor(x_r, src=r)`` for every r followed by ``sum`` and
``get_plain_text(dst)`` computes, with one zero sharing instead of K (about 10x cheaper at K = 8).
Gathering instead of CrypTen's ``reduce`` makes the views auditable: with gloo's reduce, which ranks
see partial sums depends on the reduction algorithm.

Who can unmask a party r's value: `dst` (who receives r's message) together with both ring neighbours of
r (who hold its two seeds). If `dst` is itself a neighbour, the other neighbour suffices. Any set that
lacks one of r's neighbours other than `dst` learns nothing about x_r beyond the sum.

An out-of-range or non-finite input must not hang the other ranks in the gather, so each message
carries one extra masked element, an error flag: a rank with bad input contributes zeros and flag 1,
and raises after the gather; `dst` raises when the revealed flag count is non-zero.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import torch
import torch.distributed as dist

from falsevfl_secure.crypten_shim import (
    DEFAULT_PRECISION_BITS,
    decode_fixed_point,
    encode_fixed_point,
    import_crypten,
)
from falsevfl_secure.secure.errors import SecureRangeError

__all__ = ["ReceivedShare", "ZeroShareStream", "secure_sum", "zero_share"]


class ReceivedShare(NamedTuple):
    """One message a rank received during `secure_sum`, for audits of who saw what.

    `raw` is the exact int64 payload from `src`, flattened: the first ``numel`` elements are its masked
    share of the value (row-major), the last one its masked share of the error flag.
    """

    src: int
    raw: torch.Tensor


def zero_share(crypten, numel: int) -> torch.Tensor:
    """This rank's share of one pseudo-random zero sharing of `numel` ring elements.

    Exactly CrypTen's ``ArithmeticSharedTensor.PRZS((numel,)).share`` -- the same "prev"/"next"
    generators, the same draws (``r_prev,me - r_me,next``), so the ranks' shares still sum to zero --
    but drawn into one buffer and subtracted in place: CrypTen's version allocates three tensors of
    the message's size, which costs it about 5 ms more per (10, 512, 128) sum.
    """
    cpu = torch.device("cpu")
    low, high = -(2**63), 2**63 - 1  # CrypTen's generate_random_ring_element for the 2^64 ring
    share = torch.randint(low, high, (numel,), generator=crypten.generators["prev"][cpu], dtype=torch.int64)
    other = torch.randint(low, high, (numel,), generator=crypten.generators["next"][cpu], dtype=torch.int64)
    return share.sub_(other)


class ZeroShareStream:
    """This rank's zero shares, drawn ahead of need by a background thread.

    CrypTen's generators are streams: drawing n + m ring elements gives the same numbers as drawing n
    and then m (a test checks it). So the shares of the next sums can be drawn before they are needed,
    while this rank waits for its peers, and handed out in order. Every rank takes the same number of
    elements per sum, so both holders of a seed stay aligned element for element, exactly as with
    draws on demand, and the shares still cancel. All draws run on one worker thread in submission
    order, so the generators are never touched by two threads at once; after each `take`, a draw of
    the same size is queued, so the buffer settles at one training step's worth of shares.

    What it buys: the draws (about 7 ms of the ~9 ms a party spends on a (10, 512, 128) sum here) move
    off the critical path into the time a party waits for the active party's computation.
    """

    def __init__(self, crypten) -> None:
        self._crypten = crypten
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zero-shares")
        self._pending: deque[Future] = deque()
        self._leftover: torch.Tensor | None = None

    def take(self, numel: int) -> torch.Tensor:
        """The next `numel` elements of this rank's share stream (what `zero_share` would draw now)."""
        parts, have = [], 0
        while have < numel:
            if self._leftover is None:
                if not self._pending:
                    self._pending.append(self._executor.submit(zero_share, self._crypten, numel - have))
                self._leftover = self._pending.popleft().result()
            piece = self._leftover[: numel - have]
            self._leftover = self._leftover[piece.numel():] if piece.numel() < self._leftover.numel() else None
            parts.append(piece)
            have += piece.numel()
        self._pending.append(self._executor.submit(zero_share, self._crypten, numel))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def close(self) -> None:
        """Stop drawing (before CrypTen is torn down); shares drawn ahead are dropped."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._leftover = None


def secure_sum(
    value: torch.Tensor,
    dst: int,
    *,
    precision_bits: int = DEFAULT_PRECISION_BITS,
    view: list[ReceivedShare] | None = None,
    shares: ZeroShareStream | None = None,
) -> torch.Tensor | None:
    """Sum `value` over all ranks of the initialised CrypTen world; return it (float64, CPU) on `dst` only.

    Every rank of the world must call this collectively with a tensor of the same shape (the shape is
    not secret, and is validated by the typed round that carries it). The pseudo-random zero sharing
    cancels only over the whole world, so there is no sub-group variant. Non-dst ranks return None.

    Precision: each addend is rounded to the nearest multiple of 2^-precision_bits, so the result is
    within K * 2^-(precision_bits+1) of the exact sum of the inputs (K = world size).

    Args:
        value: this rank's contribution (any real dtype, any device; moved to CPU for the crypto).
        dst: the rank that learns the sum.
        precision_bits: fractional bits of the fixed-point encoding (CrypTen's default is 16).
        view: if given, every message this rank receives is appended as a `ReceivedShare`
            (non-dst ranks receive nothing, so their view stays empty).
        shares: this rank's `ZeroShareStream` (shares drawn ahead); None draws them now. Either way
            the same shares: every rank may choose independently.

    Raises:
        SecureRangeError: on the rank whose input is non-finite or could wrap the ring for K addends,
            and on `dst` whenever any rank's input was refused (no rank is left hanging).
        RuntimeError: CrypTen is not initialised.
    """
    crypten = import_crypten()
    comm = crypten.communicator.get()  # RuntimeError "Crypten not initialized" when it is not
    world_size, rank = comm.get_world_size(), comm.get_rank()
    if not 0 <= dst < world_size:
        raise ValueError(f"dst {dst} is not a rank of the CrypTen world (size {world_size})")
    if not torch.is_tensor(value) or not (value.is_floating_point() or value.dtype == torch.int64):
        raise TypeError(
            f"value must be a real-valued torch.Tensor, got {getattr(value, 'dtype', type(value))}"
        )

    numel = value.numel()
    # This rank's share of one zero sharing; int64 addition wraps mod 2^64, exactly the ring arithmetic.
    message = zero_share(crypten, numel + 1) if shares is None else shares.take(numel + 1)
    own_error: SecureRangeError | None = None
    try:
        message[:numel] += encode_fixed_point(value, precision_bits, n_addends=world_size).reshape(-1)
    except SecureRangeError as exc:
        own_error = SecureRangeError(f"rank {rank}: {exc}")
        message[numel] += 1

    if rank != dst:
        dist.gather(message, None, dst=dst, group=comm.main_group)
        if own_error is not None:
            raise own_error
        return None

    received = [torch.empty_like(message) for _ in range(world_size)]
    dist.gather(message, received, dst=dst, group=comm.main_group)
    total = message.clone()
    for src, raw in enumerate(received):
        if src == rank:
            continue
        if view is not None:
            view.append(ReceivedShare(src, raw))
        total += raw
    if own_error is not None:
        raise own_error
    n_refused = int(total[numel])
    if n_refused != 0:
        raise SecureRangeError(
            f"secure sum refused: the input of {n_refused} part{'y' if n_refused == 1 else 'ies'} was "
            f"non-finite or "
            f"outside the safe fixed-point range for {world_size} addends (see those parties' errors)"
        )
    return decode_fixed_point(total[:numel], precision_bits).reshape(value.shape)
