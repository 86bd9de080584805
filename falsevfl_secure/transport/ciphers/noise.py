"""Differential privacy as one stage of every sum cipher: clip each row, put it on the grid, add this
party's share of discrete Gaussian noise; then the cipher (clear, masks or CKKS) protects the result.

`NoiseStage.apply` is the stage; `Noised` wraps any `SumCipher` with it (a party's own contribution is
noised before `protect`, and the active party's before `reveal` where a helper combined the others), and the
in-process transport applies the same stage to every hosted party's contribution. Each of the n parties
adds discrete Gaussian noise of variance sigma^2 / (n - 1 - t) on the fixed-point grid, sigma = the noise
multiplier times the round's clip norm: any n - 1 - t of them (the parties besides the active one and t
colluders or dropped parties) together add at least sigma^2. The grid is the secure ciphers' own
(`secure.fixed_point`, 2^-16), so the noised value is exactly what masks or CKKS carry; the noise comes
from the party's own secret AES-CTR stream (`secure.discrete_gaussian`), never from a seed anyone else holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ...randomness import KeyStream
from ...secure.discrete_gaussian import discrete_gaussian
from ...secure.errors import SecureRangeError
from ...secure.fixed_point import PRECISION_BITS
from ..rounds import Round
from .base import SumCipher

GRID = 2**PRECISION_BITS


@dataclass(frozen=True)
class NoiseSpec:
    """What every party agrees on: the clip norm of each summed round (by name; a round without one is
    refused under DP), the noise multiplier, and how many parties besides the active one may collude or drop."""

    clips: Mapping[str, float]
    multiplier: float
    collusion: int = 0

    def share_variance(self, round: Round, n_addends: int) -> int:
        """One party's noise variance for `round`, in grid units squared (rounded up)."""
        honest = n_addends - 1 - self.collusion
        if honest < 1:
            raise SecureRangeError(f"round {round.name!r}: {n_addends} parties leave no noise beyond the active "
                                   f"party's and {self.collusion} colluders")
        sigma = self.multiplier * self.clip(round) * GRID
        return max(1, math.ceil(sigma * sigma / honest))

    def clip(self, round: Round) -> float:
        if round.name not in self.clips:
            raise SecureRangeError(f"round {round.name!r} has no clip norm: it cannot run under differential privacy")
        return float(self.clips[round.name])


class NoiseStage:
    """One party's clipping and noise: the agreed spec, and a secret stream of the role secret its run started
    with, taken as the node is built and never restored (a run under a budget cannot resume, and a prediction
    loads its model's saved secret after this took its stream): each run's noise comes from a secret it drew
    fresh, so no two runs share a draw (tests that inject one secret into two runs would)."""

    def __init__(self, spec: NoiseSpec, stream: KeyStream) -> None:
        self.spec, self.stream = spec, stream

    def around(self, cipher: SumCipher, parties: Callable[[], int]) -> Noised:
        """`cipher` with this stage before it; `parties` counts the parties still in the run."""
        return Noised(cipher, self, parties)

    def apply(self, round: Round, value: Tensor, n_addends: int) -> Tensor:
        """`value` with each row clipped to the round's norm, on the grid, plus this party's noise (float64). A
        non-finite value comes out as NaN everywhere, for the cipher to refuse as it would without DP (its NaN norm
        clipped nothing, and on the grid it became -2^63: finite, far past the clip, and where it was)."""
        raw = value.detach().to("cpu", torch.float64)
        if not bool(torch.isfinite(raw).all()):
            return torch.full_like(raw, float("nan")).to(value.device)
        rows = clip_rows(raw, round, self.spec.clip(round))
        grid = torch.round(rows * GRID).to(torch.int64)
        noise = discrete_gaussian(self.spec.share_variance(round, n_addends), grid.numel(), self.stream)
        return ((grid + torch.from_numpy(noise).reshape(grid.shape)).double() / GRID).to(value.device)


def clip_rows(value: Tensor, round: Round, norm: float) -> Tensor:
    """Each batch row of `value` (the round's batch axis; the whole payload when it has none) scaled to L2
    norm at most `norm` less the grid's rounding (sqrt(d) / 2 grid steps), so it stays within `norm` on the grid."""
    axis = round.batch_axis
    moved = value.reshape(1, -1) if axis is None else value.movedim(axis, 0)
    flat = moved.reshape(moved.shape[0], -1)
    limit = max(norm - math.sqrt(flat.shape[1]) / (2 * GRID), 0.0)
    scale = (limit / flat.norm(dim=1).clamp(min=1e-300)).clamp(max=1.0)
    clipped = (flat * scale.unsqueeze(1)).reshape(moved.shape)
    return clipped.reshape(value.shape) if axis is None else clipped.movedim(0, axis)


class Noised(SumCipher):
    """`inner` with the noise stage before it: every party's contribution is clipped and noised before it is
    protected; the rest (sizes, views, combining, revealing) is the inner cipher's."""

    def __init__(self, inner: SumCipher, stage: NoiseStage, parties: Callable[[], int]) -> None:
        self.inner, self.stage, self.parties = inner, stage, parties
        self.protection, self.combined_by = inner.protection, inner.combined_by

    def protect(self, round: Round, value: Tensor, n_addends: int) -> tuple[bytes, SecureRangeError | None]:
        return self.inner.protect(round, self.stage.apply(round, value, n_addends), n_addends)

    def reveal(self, round: Round, combined: bytes, shape: tuple[int, ...], own: Tensor | None) -> Tensor:
        own = None if own is None else self.stage.apply(round, own, self.parties())
        return self.inner.reveal(round, combined, shape, own)

    def message_bytes(self, round: Round, numel: int) -> int | None:
        return self.inner.message_bytes(round, numel)

    def wire_bytes(self, round: Round, numel: int) -> int:
        return self.inner.wire_bytes(round, numel)

    def seen(self, message: bytes, shape: tuple[int, ...] | None) -> np.ndarray:
        return self.inner.seen(message, shape)

    def combine(self, round: Round, messages: Mapping[int, bytes], shape: tuple[int, ...]) -> bytes:
        return self.inner.combine(round, messages, shape)

    def explain(self, round: Round, refusal: SecureRangeError, me: str, n_addends: int) -> str:
        return self.inner.explain(round, refusal, me, n_addends)

    def addend_range(self, n_addends: int) -> float:
        return self.inner.addend_range(n_addends)

    def reveal_error(self, n_addends: int, magnitude: float) -> float:
        return self.inner.reveal_error(n_addends, magnitude)  # the noise is not an error: `noise_variance`

    def rekey(self, pair_keys: dict[int, bytes], alive: Sequence[int]) -> None:
        self.inner.rekey(pair_keys, alive)

    def close(self) -> None:
        self.inner.close()
