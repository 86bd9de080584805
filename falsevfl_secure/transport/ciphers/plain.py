"""The `plain` protocol: contributions travel in clear (inside the links' TLS).

The active party receives every party's contribution separately and sums them itself, so it sees each
one: the baseline the secure protocols are measured against, and the leak the audits catch. A non-finite
contribution is refused as under mpc and he: the party whose input it is refuses it (and sends NaNs in its
place, never its values, so nobody is left waiting), and the active party refuses any non-finite
contribution it receives, before it sums anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ...secure.errors import SecureRangeError
from ..rounds import Round, check_contributions
from .base import Membership, Protocol, SumCipher


class ClearCipher(SumCipher):
    """float32 values as they are; the active party adds them in party order, exactly as the local runtime."""

    protection = "clear"

    def __init__(self, n_parties: int) -> None:
        self.n_parties = n_parties

    def protect(self, round: Round, value: Tensor, n_addends: int) -> tuple[bytes, SecureRangeError | None]:
        value = value.to(torch.float32)  # a noised value comes as float64 (the grid ciphers keep it exact)
        finite = torch.isfinite(value)
        if bool(finite.all()):
            return value.numpy().tobytes(), None
        refusal = SecureRangeError(f"refused its own input: {int((~finite).sum())} NaN/inf value(s)")
        return torch.full_like(value, float("nan")).numpy().tobytes(), refusal  # the refusal, without the values

    def message_bytes(self, round: Round, numel: int) -> int:
        return 4 * numel

    def seen(self, message: bytes, shape: tuple[int, ...] | None = None) -> np.ndarray:
        values = np.frombuffer(message, dtype="<f4").copy()
        return values.reshape(shape) if shape is not None else values

    @staticmethod
    def derivable(seen: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
        return [seen] if seen.dtype.kind == "f" and seen.shape == tuple(shape) else []  # a contribution as it is

    def combine(self, round: Round, messages: Mapping[int, bytes], shape: tuple[int, ...]) -> bytes:
        values = {k: torch.from_numpy(self.seen(m, shape)) for k, m in messages.items()}
        check_contributions(round, list(values), list(values.values()), self.n_parties)
        ranks = sorted(values)
        total = values[ranks[0]].clone()
        for sender in ranks[1:]:  # in party order, exactly as the local runtime sums
            total = total + values[sender]
        return total.numpy().tobytes()

    def reveal(self, round: Round, combined: bytes, shape: tuple[int, ...], own: Tensor | None) -> Tensor:
        total = torch.from_numpy(self.seen(combined, shape))
        return total if own is None else total + own

    def explain(self, round: Round, refusal: SecureRangeError, me: str, n_addends: int) -> str:
        return f"round {round.name!r}: {me} {refusal}"


@dataclass(frozen=True)
class Plain(Protocol):
    name: ClassVar[str] = "plain"
    protection: ClassVar[str] = ClearCipher.protection
    cipher_class: ClassVar[type[SumCipher]] = ClearCipher
    runtimes: ClassVar[tuple[str, ...]] = ("local", "distributed")
    hides_contributions: ClassVar[bool] = False

    def cipher(self, m: Membership) -> SumCipher:
        return ClearCipher(m.n_parties)

    def in_process(self, parties: int, active: int = 0) -> tuple[list[SumCipher], SumCipher | None]:
        return [ClearCipher(parties) for _ in range(parties)], None
