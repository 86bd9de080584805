"""The `mpc` protocol: every sum is a pairwise-masked secret-shared sum revealed to the active party
only (`secure.mpc_sum`); broadcasts travel in clear (inside the links' TLS), as in `plain`.

The pair keys come from the session's signed X25519 exchange (`network.handshake`); nothing secret
comes from CrypTen's generators or from any seed.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError
from ...network.handshake import pair_keys
from ...secure.errors import SecureRangeError
from ...secure.fixed_point import PRECISION_BITS, max_safe_abs
from ...secure.masks import ZeroShares
from ...secure.mpc_sum import masked_message, open_total
from ..rounds import Round
from .base import Membership, Protocol, SumCipher

GRIDS = tuple(range(16, 33))  # the precisions mpc takes (`Mpc`); the audit reads a share on each


class MaskCipher(SumCipher):
    """Fixed-point values on Z_2^64 plus this party's zero share (pairwise AES-CTR masks that cancel over the
    parties), and one masked flag element that counts refused inputs; the active party adds the messages."""

    protection = "secret-shared"

    def __init__(self, rank: int, pair_keys: dict[int, bytes], protocol: Mpc | None = None) -> None:
        self.protocol = protocol if protocol is not None else Mpc()
        self.rank, self.parties = rank, len(pair_keys) + 1
        self.shares = ZeroShares(rank, pair_keys)
        # Each count of addends' range, worked out once: `protect` looks its bound up on every sum.
        self.limits = {n: self.addend_range(n) for n in range(1, self.parties + 1)}

    def protect(self, round: Round, value: Tensor, n_addends: int) -> tuple[bytes, SecureRangeError | None]:
        limit = self.limits.get(n_addends) or self.addend_range(n_addends)
        message, refusal = masked_message(value, self.shares, n_addends, limit, self.protocol.precision_bits)
        return message.numpy().astype("<i8", copy=False).tobytes(), refusal

    def message_bytes(self, round: Round, numel: int) -> int:
        return 8 * (numel + 1)  # the values and the range flag, int64 ring elements

    def seen(self, message: bytes, shape: tuple[int, ...] | None = None) -> np.ndarray:
        return np.frombuffer(message, dtype="<i8").astype(np.int64)

    @staticmethod
    def derivable(seen: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
        """A share decoded as fixed point on every grid mpc allows, the default first (an unmasked share
        decodes to the contribution on its run's grid)."""
        if seen.dtype != np.int64 or seen.size != math.prod(shape) + 1:  # the values and the flag
            return []
        values = seen[:-1].astype(np.float64).reshape(shape)
        grids = (PRECISION_BITS, *(b for b in GRIDS if b != PRECISION_BITS))
        return [values / 2.0**bits for bits in grids]

    def combine(self, round: Round, messages: Mapping[int, bytes], shape: tuple[int, ...]) -> bytes:
        total = torch.zeros(len(next(iter(messages.values()))) // 8, dtype=torch.int64)
        for message in messages.values():
            total += torch.from_numpy(self.seen(message))  # wraps on the ring
        return total.numpy().astype("<i8", copy=False).tobytes()

    def reveal(self, round: Round, combined: bytes, shape: tuple[int, ...], own: Tensor | None) -> Tensor:
        try:
            total = open_total(torch.from_numpy(self.seen(combined)), self.parties,
                               self.protocol.precision_bits).reshape(shape)
        except SecureRangeError as error:
            raise SecureRangeError(self._with_range(round, error, self.parties)) from None
        return total if own is None else total + own.double()

    def explain(self, round: Round, refusal: SecureRangeError, me: str, n_addends: int) -> str:
        return self._with_range(round, f"{me} refused its own input: {refusal}", n_addends)

    def _with_range(self, round: Round, error: SecureRangeError | str, parties: int) -> str:
        return (f"round {round.name!r}: {error}; mpc carries |x| < {self.addend_range(parties):.3g} per party at "
                f"K = {parties} (check the features are standardised and finite)")

    @staticmethod
    def range_under(protocol: Mpc, n_addends: int) -> float:
        return max_safe_abs(n_addends, protocol.precision_bits)  # the ring's, on the protocol's grid

    def reveal_error(self, n_addends: int, magnitude: float) -> float:
        step = 2.0 ** -self.protocol.precision_bits
        return n_addends * (step / 2 + magnitude * 2.0**-52)  # the grid, then float64

    def rekey(self, pair_keys: dict[int, bytes], alive: Sequence[int]) -> None:
        self.shares.close()
        kept = {k: key for k, key in pair_keys.items() if k in alive}
        self.shares, self.parties = ZeroShares(self.rank, kept), len(kept) + 1

    def close(self) -> None:
        self.shares.close()


@dataclass(frozen=True)
class Mpc(Protocol):
    """`precision_bits`: the fractional bits of the fixed-point grid (`secure.fixed_point`), 16 to 32. No
    coarser than 2^-16: the noise stage draws every party's noise on that grid, and a coarser one would round
    each party's noised value again (the noise summed would no longer be the noise accounted for); no finer
    than 2^-32, where a party at K = 100 still carries |x| < 2^24. Masks hide any grid alike (they are
    uniform on the ring). `agreement` makes each party's key-agreement
    object; tests inject deliberately weak ones (the shipped build never sets it)."""

    name: ClassVar[str] = "mpc"
    protection: ClassVar[str] = MaskCipher.protection
    cipher_class: ClassVar[type[SumCipher]] = MaskCipher
    precision_bits: int = PRECISION_BITS
    agreement: object = field(default=None, compare=False)

    def __post_init__(self) -> None:
        bits = self.precision_bits
        if type(bits) is not int or bits not in GRIDS:
            raise InputError(f"mpc: precision_bits = {bits!r}; it takes a whole number of bits from "
                             f"{GRIDS[0]} to {GRIDS[-1]}")

    def key_agreement(self):
        return self.agreement() if self.agreement is not None else super().key_agreement()

    def cipher(self, m: Membership) -> SumCipher:
        return MaskCipher(m.rank, pair_keys(m.session, m.peers.names[m.rank], m.exchange, "secure-sum"), self)

    def in_process(self, parties: int, active: int = 0) -> tuple[list[SumCipher], SumCipher | None]:
        pairs = {(a, b): secrets.token_bytes(32) for a in range(parties) for b in range(a + 1, parties)}
        keys = [{b if a == k else a: key for (a, b), key in pairs.items() if k in (a, b)} for k in range(parties)]
        return [MaskCipher(k, keys[k], self) for k in range(parties)], None
