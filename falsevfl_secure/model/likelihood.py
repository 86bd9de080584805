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
    _index: dict = field(default_factory=dict, compare=False, repr=False)

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

    def signature(self) -> tuple:
        return self.width, self.gaussian, self.binary, self.groups

    def index(self, device: torch.device) -> dict[str, Tensor]:
        """The index tensors on `device` (made once per device): cells per kind, the padded groups."""
        if device not in self._index:
            longest = max((b - a for a, b in self.groups), default=1)
            pad = [[a + min(i, b - a - 1) for i in range(longest)] for a, b in self.groups]
            valid = [[i < b - a for i in range(longest)] for a, b in self.groups]
            long = {"dtype": torch.long, "device": device}
            self._index[device] = {
                "gaussian": torch.tensor(self.gaussian, **long),
                "binary": torch.tensor(self.binary, **long),
                "cells": torch.tensor([c for a, b in self.groups for c in range(a, b)], **long),
                "starts": torch.tensor([a for a, _ in self.groups], **long),
                "pad": torch.tensor(pad, **long).reshape(len(pad), longest),
                "valid": torch.tensor(valid, dtype=torch.bool, device=device).reshape(len(pad), longest)}
        return self._index[device]


def _masked_sum(cells: Tensor, observed: Tensor | None) -> Tensor:
    return (cells if observed is None else torch.where(observed, cells, torch.zeros_like(cells))).sum(-1)


def _gaussian(x: Tensor, mean: Tensor, std: Tensor, observed: Tensor | None, at: Tensor) -> Tensor:
    x, mean, std = x[..., at], mean[..., at], std[..., at]
    if observed is None:
        return diagonal_gaussian_log_prob(x, mean, std)
    return observed_gaussian_log_prob(x, mean, std, observed[..., at])


def _bernoulli(x: Tensor, logit: Tensor, observed: Tensor | None, at: Tensor) -> Tensor:
    logit, target = logit[..., at], (x[..., at] > 0.5).to(logit.dtype)
    return _masked_sum(target * logit - F.softplus(logit), None if observed is None else observed[..., at])


def _categorical(x: Tensor, logit: Tensor, observed: Tensor | None, index: dict[str, Tensor]) -> Tensor:
    """sum_g [x_g . logits_g - logsumexp(logits_g)] over the observed groups (x_g one-hot, or the
    category shares under cell_handling "mean", a soft target)."""
    padded = logit[..., index["pad"]].masked_fill(~index["valid"], -math.inf)
    normaliser = torch.logsumexp(padded, dim=-1)  # (..., G)
    cells = index["cells"]
    picked = _masked_sum(x[..., cells] * logit[..., cells], None if observed is None else observed[..., cells])
    return picked - _masked_sum(normaliser, None if observed is None else observed[..., index["starts"]])


def cell_log_likelihood(layout: CellLayout | None, x: Tensor, mean: Tensor, std: Tensor,
                        observed: Tensor | None) -> Tensor:
    """log p(x_obs | h) summed over the last axis; `mean` doubles as the logits of non-Gaussian cells.
    `observed` None: every cell observed. An all-Gaussian layout computes exactly what it always did."""
    if layout is None or layout.all_gaussian:
        return diagonal_gaussian_log_prob(x, mean, std) if observed is None else \
            observed_gaussian_log_prob(x, mean, std, observed)
    x = x.expand_as(mean)
    observed = None if observed is None else observed.expand(mean.shape)
    index = layout.index(mean.device)
    total = _gaussian(x, mean, std, observed, index["gaussian"]) if layout.gaussian else 0.0
    if layout.binary:
        total = total + _bernoulli(x, mean, observed, index["binary"])
    if layout.groups:
        total = total + _categorical(x, mean, observed, index)
    return total


def cell_means(layout: CellLayout | None, mean: Tensor, std: Tensor, noise: Tensor) -> Tensor:
    """A stand-in for the values a party lacks (FALSE-VFL-II's imputation): Gaussian cells a reparameterised
    draw mean + std * noise; Bernoulli and categorical cells their expected one-hot value (the decoder's
    probabilities: a binary cell is encoded 0/1), not a draw."""
    draw = mean + std * noise
    if layout is None or layout.all_gaussian:
        return draw
    index = layout.index(mean.device)
    out = draw.clone()
    if layout.binary:
        out[..., index["binary"]] = torch.sigmoid(mean[..., index["binary"]])
    for start, stop in layout.groups:
        out[..., start:stop] = torch.softmax(mean[..., start:stop], dim=-1)
    return out
