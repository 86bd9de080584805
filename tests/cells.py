"""Test helper: a split with empty cells inside the blocks its parties hold."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import numpy as np

from falsevfl_secure.data import VerticalSplit


def with_missing_cells(split: VerticalSplit, rate: float, seed: int,
                       parties: Collection[int] | None = None) -> VerticalSplit:
    """`split` with each cell of a held block of `parties` (default: all) empty with probability `rate`
    (0.0 in the block, False in `observed`), keeping at least one observed cell in every held block, so
    the block mask is unchanged."""
    rng = np.random.default_rng([seed, 77])
    blocks, observed = [], []
    for k, block in enumerate(split.blocks):
        cells = rng.random(block.shape) >= (rate if parties is None or k in parties else 0.0)
        empty = np.flatnonzero(~cells.any(axis=1))
        cells[empty, rng.integers(0, block.shape[1], empty.size)] = True
        cells[split.missing[:, k]] = False
        blocks.append(np.where(cells, block, np.float32(0.0)).astype(np.float32))
        observed.append(cells)
    return replace(split, blocks=blocks, observed=observed)
