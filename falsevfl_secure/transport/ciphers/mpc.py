"""The `mpc` protocol: every sum is a pairwise-masked secret-shared sum revealed to the active party
only (`secure.mpc_sum`); broadcasts travel in clear (inside the links' TLS), as in `plain`.

The pair keys come from the session's signed X25519 exchange (`network.handshake`); nothing secret
comes from CrypTen's generators or from any seed.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ...network.handshake import pair_keys
from ...secure.errors import SecureRangeError
from ...secure.fixed_point import PRECISION_BITS, max_safe_abs
from ...secure.masks import ZeroShares
from ...secure.mpc_sum import masked_message, open_total
from ..rounds import Round
from .base import Membership, Protocol, SumCipher


class MaskCipher(SumCipher):
    """Fixed-point values on Z_2^64 plus this party's zero share (pairwise AES-CTR masks that cancel over the
    parties), and one masked flag element that counts refused inputs; the active party adds the messages."""

    protection = "secret-shared"

    def __init__(self, rank: int, pair_keys: dict[int, bytes]) -> None:
        self.rank, self.parties = rank, len(pair_keys) + 1
        self.shares = ZeroShares(rank, pair_keys)

    def protect(self, round: Round, value: Tensor, n_addends: int) -> tuple[bytes, SecureRangeError | None]:
        message, refusal = masked_message(value, self.shares, n_addends, None)
        return message.numpy().astype("<i8", copy=False).tobytes(), refusal

    def message_bytes(self, round: Round, numel: int) -> int:
        return 8 * (numel + 1)  # the values and the range flag, int64 ring elements

    def seen(self, message: bytes, shape: tuple[int, ...] | None = None) -> np.ndarray:
        return np.frombuffer(message, dtype="<i8").astype(np.int64)

    @staticmethod
    def derivable(seen: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
        """A share decoded as fixed point (an unmasked share decodes to the contribution)."""
        if seen.dtype != np.int64 or seen.size != math.prod(shape) + 1:  # the values and the flag
            return []
        return [(seen[:-1].astype(np.float64) / 2**PRECISION_BITS).reshape(shape)]

    def combine(self, round: Round, messages: Mapping[int, bytes], shape: tuple[int, ...]) -> bytes:
        total = torch.zeros(len(next(iter(messages.values()))) // 8, dtype=torch.int64)
        for message in messages.values():
            total += torch.from_numpy(self.seen(message))  # wraps on the ring
        return total.numpy().astype("<i8", copy=False).tobytes()

    def reveal(self, round: Round, combined: bytes, shape: tuple[int, ...], own: Tensor | None) -> Tensor:
        try:
            total = open_total(torch.from_numpy(self.seen(combined)), self.parties).reshape(shape)
        except SecureRangeError as error:
            raise SecureRangeError(self._with_range(round, error, self.parties)) from None
        return total if own is None else total + own.double()

    def explain(self, round: Round, refusal: SecureRangeError, me: str, n_addends: int) -> str:
        return self._with_range(round, refusal, n_addends)

    @staticmethod
    def _with_range(round: Round, error: SecureRangeError, parties: int) -> str:
        return (f"round {round.name!r}: {error}; mpc carries |x| < {max_safe_abs(parties):.3g} per party at K = "
                f"{parties} (check the features are standardised and finite)")

    def addend_range(self, n_addends: int) -> float:
        return max_safe_abs(n_addends)

    def reveal_error(self, n_addends: int, magnitude: float) -> float:
        return n_addends * (2.0 ** -(PRECISION_BITS + 1) + magnitude * 2.0**-52)  # the grid, then float64

    def rekey(self, pair_keys: dict[int, bytes], alive: list[int]) -> None:
        self.shares.close()
        kept = {k: key for k, key in pair_keys.items() if k in alive}
        self.shares, self.parties = ZeroShares(self.rank, kept), len(kept) + 1

    def close(self) -> None:
        self.shares.close()


@dataclass(frozen=True)
class Mpc(Protocol):
    """`agreement` makes each party's key-agreement object; tests inject deliberately weak ones (the
    shipped build never sets it)."""

    name: ClassVar[str] = "mpc"
    protection: ClassVar[str] = MaskCipher.protection
    cipher_class: ClassVar[type[SumCipher]] = MaskCipher
    agreement: object = field(default=None, compare=False)

    def addend_range(self, parties: int) -> float:
        return max_safe_abs(parties)

    def key_agreement(self):
        return self.agreement() if self.agreement is not None else super().key_agreement()

    def cipher(self, m: Membership) -> SumCipher:
        return MaskCipher(m.rank, pair_keys(m.session, m.peers.names[m.rank], m.exchange, "secure-sum"))

    def in_process(self, parties: int, active: int = 0) -> tuple[list[SumCipher], SumCipher | None]:
        pairs = {(a, b): secrets.token_bytes(32) for a in range(parties) for b in range(a + 1, parties)}
        keys = [{b if a == k else a: key for (a, b), key in pairs.items() if k in (a, b)} for k in range(parties)]
        return [MaskCipher(k, keys[k]) for k in range(parties)], None
