"""A party's decoder likelihood p(x^k | h), one distribution per column kind.

A party's block is its encoded table: a standardised numeric column is one cell, a binary column (two
values in training) one cell, a categorical column one one-hot group of cells. The decoder emits two
numbers per cell (its output shape does not depend on the kinds, so checkpoints and batched parties
stay as they were); how they are read depends on the cell's kind:

- Gaussian (numeric): N(x; mean, std^2), std = softplus(raw) + floor (the paper's choice for every cell);
- Bernoulli (binary): the encoding writes a two-valued column as 0 (the smaller value) and 1 (the larger);
  the first number is the logit of 1; the second is unused;
- categorical (one-hot group): the first numbers of the group's cells are the logits of a softmax over
  the group; the second numbers are unused.

An unobserved cell adds exactly 0 and passes no gradient; a group counts as observed when its first cell
is (the encoding marks a group's cells together). The layout is the party's own (derived from its own
encoding, never sent): what crosses is still the one summed scalar per sample and row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ..bounds import diagonal_gaussian_log_prob, observed_gaussian_log_prob

KINDS = ("numeric", "binary", "categorical")


@dataclass(frozen=True)
class CellLayout:
    """Which encoded cells are Gaussian, Bernoulli or in which categorical group ([start, stop))."""

    width: int
    gaussian: tuple[int, ...]
    binary: tuple[int, ...] = ()
    groups: tuple[tuple[int, int], ...] = ()
    _masks: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def numeric(cls, width: int) -> CellLayout:
        """Every cell Gaussian: the paper's model (and every `simulate` dataset)."""
        return cls(width, tuple(range(width)))

    @classmethod
    def from_kinds(cls, kinds: Iterable[tuple[str, int, int]]) -> CellLayout:
        """From (kind, start, stop) per raw column, kind one of KINDS, in column order."""
        gaussian, binary, groups, width = [], [], [], 0
        for kind, start, stop in kinds:
            if kind not in KINDS or start != width or stop <= start or (kind != "categorical" and stop != start + 1):
                raise ValueError(f"cell layout: bad column ({kind!r}, {start}, {stop}) after {width} cells")
            {"numeric": gaussian, "binary": binary}.get(kind, []).append(start)
            if kind == "categorical":
                groups.append((start, stop))
            width = stop
        return cls(width, tuple(gaussian), tuple(binary), tuple(groups))

    @property
    def all_gaussian(self) -> bool:
        return not self.binary and not self.groups

    def masks(self, device: torch.device) -> dict[str, Tensor]:
        """(width,) bool masks of the Gaussian, Bernoulli and categorical cells on `device` (made once)."""
        if device not in self._masks:
            kinds = torch.zeros(self.width, dtype=torch.long)
            kinds[list(self.binary)] = 1
            for a, b in self.groups:
                kinds[a:b] = 2
            self._masks[device] = {name: (kinds == i).to(device) for i, name in enumerate(KINDS)}
        return self._masks[device]


def _where(mask: Tensor | None, cells: Tensor) -> Tensor:
    return cells if mask is None else torch.where(mask, cells, torch.zeros_like(cells))


def _typed_cells(x: Tensor, mean: Tensor, std: Tensor, masks: dict[str, Tensor]) -> Tensor:
    """Each cell's own term, elementwise over the whole block (masks and slices, no gather: a gather's
    copies and scatters cost more than the arithmetic here): the Gaussian log-density, the Bernoulli
    log-probability of x > 0.5, and x * logit for a categorical cell (its group's normaliser comes after)."""
    z = (x - mean) / std
    gaussian = -0.5 * (z * z) - std.log() - 0.5 * math.log(2 * math.pi)
    # log sigmoid(+-logit) as -softplus(-+logit): x * l - softplus(l) loses exp(-20) where softplus turns linear
    bernoulli = -F.softplus(torch.where(x > 0.5, -mean, mean))
    out = torch.where(masks["numeric"], gaussian, torch.zeros_like(gaussian))
    out = torch.where(masks["binary"], bernoulli, out)
    return torch.where(masks["categorical"], x * mean, out)


def _normalisers(layout: CellLayout, logit: Tensor, observed: Tensor | None) -> Tensor | float:
    """The sum over the observed categorical groups of logsumexp(the group's logits), a slice per group."""
    total = 0.0
    for start, stop in layout.groups:
        normaliser = torch.logsumexp(logit[..., start:stop], dim=-1)
        total = total + _where(None if observed is None else observed[..., start], normaliser)
    return total


def cell_log_likelihood(layout: CellLayout | None, x: Tensor, mean: Tensor, std: Tensor,
                        observed: Tensor | None) -> Tensor:
    """log p(x_obs | h) summed over the last axis; `mean` doubles as the logits of non-Gaussian cells.
    `observed` None: every cell observed. An all-Gaussian layout computes exactly what it always did."""
    if layout is None or layout.all_gaussian:
        return diagonal_gaussian_log_prob(x, mean, std) if observed is None else \
            observed_gaussian_log_prob(x, mean, std, observed)
    cells = _where(observed, _typed_cells(x, mean, std, layout.masks(mean.device)))
    return cells.sum(-1) - _normalisers(layout, mean, observed)


def cell_means(layout: CellLayout | None, mean: Tensor, std: Tensor, noise: Tensor) -> Tensor:
    """A stand-in for the values a party lacks (FALSE-VFL-II's imputation): Gaussian cells a reparameterised
    draw mean + std * noise; Bernoulli and categorical cells their expected one-hot value (the decoder's
    probabilities: a binary cell is encoded 0/1), not a draw."""
    draw = mean + std * noise
    if layout is None or layout.all_gaussian:
        return draw
    out = torch.where(layout.masks(mean.device)["binary"], torch.sigmoid(mean), draw)
    for start, stop in layout.groups:
        out = torch.cat([out[..., :start], torch.softmax(mean[..., start:stop], dim=-1), out[..., stop:]], dim=-1)
    return out
