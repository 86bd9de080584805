"""A party's decoder likelihood p(x^k | h), one distribution per column kind.

A party's block is its encoded table: a standardised numeric column is one cell, a binary column (two
values in training) one cell, a categorical column one one-hot group of cells. How the decoder's output
is read depends on the layout:

- every cell Gaussian (the paper's model, every `simulate` dataset): a mean and a std per cell,
  N(x; mean, std^2), std = softplus(raw) + floor;
- typed (a table with binary or categorical columns): one number per cell in the layout's kind order
  (the Gaussian cells' means, the binary cells' logits, the categorical groups' logits) and then a std per
  Gaussian cell only. A Bernoulli cell's number is the logit of 1 (the encoding writes a two-valued
  column as 0, the smaller value, and 1); a categorical group's numbers are the logits of a softmax over
  the group. Kind order makes every kind one contiguous slice (no per-cell mask or gather over the S x B
  samples); the x and observed blocks, S times smaller, are put in that order instead.

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
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

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

    @property
    def decoder_width(self) -> int:
        """The numbers the decoder emits per sample and row (see the module's docstring)."""
        return 2 * self.width if self.all_gaussian else self.width + len(self.gaussian)

    @property
    def ordered_groups(self) -> tuple[tuple[int, int], ...]:
        """The categorical groups' [start, stop) in kind order: after the Gaussian and binary cells."""
        start, out = len(self.gaussian) + len(self.binary), []
        for a, b in self.groups:
            out.append((start, start + b - a))
            start += b - a
        return tuple(out)

    def order(self, device: torch.device) -> Tensor:
        """(width,) the cells in kind order: Gaussian, binary, then each group's cells (made once per device)."""
        if ("order", device) not in self._cache:
            cells = [*self.gaussian, *self.binary, *(c for a, b in self.groups for c in range(a, b))]
            self._cache["order", device] = torch.tensor(cells, dtype=torch.long, device=device)
        return self._cache["order", device]

    def group_firsts(self, device: torch.device, per_cell: bool = False) -> Tensor:
        """Each group's first cell ((groups,); `per_cell`: for each categorical cell, (cells,)), counted from
        the first categorical cell in kind order: a group is observed where its first cell is."""
        if ("firsts", per_cell, device) not in self._cache:
            offset, firsts = len(self.gaussian) + len(self.binary), []
            for a, b in self.ordered_groups:
                firsts += [a - offset] * (b - a if per_cell else 1)
            self._cache["firsts", per_cell, device] = torch.tensor(firsts, dtype=torch.long, device=device)
        return self._cache["firsts", per_cell, device]

    def in_order(self, values: Tensor) -> Tensor:
        """A block (..., width) in column order put in kind order."""
        return values.index_select(-1, self.order(values.device))

    def in_columns(self, values: Tensor) -> Tensor:
        """A block (..., width) in kind order put back in column order."""
        if ("columns", values.device) not in self._cache:
            self._cache["columns", values.device] = torch.argsort(self.order(values.device))
        return values.index_select(-1, self._cache["columns", values.device])


def _where(mask: Tensor | None, cells: Tensor) -> Tensor:
    return cells if mask is None else torch.where(mask, cells, torch.zeros_like(cells))


def read_decoder(layout: CellLayout | None, decoded: Tensor, min_std: float) -> tuple[Tensor, Tensor]:
    """(first, std) from the decoder's output: every cell's mean or logits, (..., width), and the std of
    the Gaussian cells (all of them for an all-Gaussian layout) with a floor, so that the likelihood of
    standardised data cannot diverge by collapsing a variance."""
    if layout is None or layout.all_gaussian:
        first, raw_std = decoded.chunk(2, dim=-1)
    else:
        first, raw_std = decoded[..., :layout.width], decoded[..., layout.width:]
    return first, F.softplus(raw_std.contiguous()) + min_std  # a strided slice takes a slow path (15x)


def _kind_terms(layout: CellLayout, x: Tensor, first: Tensor, std: Tensor, observed: Tensor | None) -> Tensor:
    """The summed log-likelihood with x, observed and first in kind order, std of the Gaussian cells. Split,
    not sliced: a split's backward is one concatenation, a slice's a zero-filled tensor per slice."""
    sizes = [len(layout.gaussian), len(layout.binary), sum(b - a for a, b in layout.groups)]
    (mean, logit, logits), (xg, xb, xc) = first.split(sizes, -1), x.split(sizes, -1)
    seen = [None] * 3 if observed is None else observed.split(sizes, -1)
    total = torch.zeros((), dtype=first.dtype, device=first.device)
    if sizes[0]:
        z = (xg - mean) / std
        total = total + _where(seen[0], -0.5 * (z * z) - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
    if sizes[1]:
        # log sigmoid(+-logit) as -softplus(-+logit): x * l - softplus(l) loses exp(-20) where softplus turns linear
        total = total - _where(seen[1], F.softplus(torch.where(xb > 0.5, -logit, logit))).sum(-1)
    if sizes[2]:
        # x . logits over the one-hot cells (x zeroed where its group is unobserved, on the (B, d) block
        # before it broadcasts over the samples), then each observed group's normaliser
        firsts = [None] * 2 if observed is None else \
            [seen[2].index_select(-1, layout.group_firsts(observed.device, cells)) for cells in (True, False)]
        total = total + (_where(firsts[0], xc) * logits).sum(-1)
        widths = [b - a for a, b in layout.groups]
        normalisers = torch.stack([torch.logsumexp(group, -1) for group in logits.split(widths, -1)], -1)
        total = total - _where(firsts[1], normalisers).sum(-1)
    return total


def decoded_log_likelihood(layout: CellLayout | None, x: Tensor, observed: Tensor | None, first: Tensor,
                           std: Tensor) -> Tensor:
    """log p(x_obs | h) summed over the last axis from `read_decoder`'s (first, std); x and `observed`
    in column order (`observed` None: every cell observed)."""
    if layout is None or layout.all_gaussian:
        return diagonal_gaussian_log_prob(x, first, std) if observed is None else \
            observed_gaussian_log_prob(x, first, std, observed)
    return _kind_terms(layout, layout.in_order(x), first, std, None if observed is None else layout.in_order(observed))


def cell_log_likelihood(layout: CellLayout | None, x: Tensor, mean: Tensor, std: Tensor,
                        observed: Tensor | None) -> Tensor:
    """log p(x_obs | h) summed over the last axis, with every tensor in column order: `mean` (..., width)
    doubles as the logits of non-Gaussian cells, whose `std` is not read. An all-Gaussian layout computes
    exactly the paper's Gaussian."""
    if layout is None or layout.all_gaussian:
        return decoded_log_likelihood(layout, x, observed, mean, std)
    gaussian = torch.tensor(layout.gaussian, dtype=torch.long, device=std.device)
    return decoded_log_likelihood(layout, x, observed, layout.in_order(mean), std.index_select(-1, gaussian))


def cell_means(layout: CellLayout | None, first: Tensor, std: Tensor, noise: Tensor) -> Tensor:
    """A stand-in, in column order, for the values a party lacks (FALSE-VFL-II's imputation) from
    `read_decoder`'s (first, std) and standard normal `noise` (..., width): Gaussian cells a reparameterised
    draw mean + std * noise; Bernoulli and categorical cells their expected one-hot value (the decoder's
    probabilities: a binary cell is encoded 0/1), not a draw."""
    if layout is None or layout.all_gaussian:
        return first + std * noise
    g, b = len(layout.gaussian), len(layout.binary)
    parts = [first[..., :g] + std * noise[..., :g], torch.sigmoid(first[..., g:g + b])]
    parts += [torch.softmax(first[..., start:stop], dim=-1) for start, stop in layout.ordered_groups]
    return layout.in_columns(torch.cat(parts, dim=-1))
