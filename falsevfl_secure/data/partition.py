"""The vertical partition: which features each party holds.

Each party holds one contiguous block of the (flattened) feature axis, as in the paper's
Appendix "Datasets and Models": Isolet 8 x 77 and HAPT 8 x 70 (leftover features at the end are
discarded), Fashion-MNIST 8 tiles of 14 x 7 pixels (a 2 x 4 grid, row-major tile order), and the
embedded digits by pixel rows (so K must divide 8). Blocks are index arrays into the flattened
feature axis, so a party's data is simply `x[:, block]`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import DataError
from .loaders import DATASET_SPECS, Dataset


def _check_parties(parties: int, n_features: int) -> int:
    if isinstance(parties, bool) or not isinstance(parties, int | np.integer):
        raise DataError(f"parties must be an integer, got {parties!r}")
    if parties < 2:
        raise DataError(f"parties={parties}: vertical federated learning needs at least 2 parties")
    if parties > n_features:
        raise DataError(f"parties={parties} exceeds the number of features ({n_features}): "
                        "every party must hold at least one feature")
    return int(parties)


def feature_blocks(dataset: Dataset, parties: int) -> list[np.ndarray]:
    """One int64 index array per party into the flattened feature axis (disjoint, in party order)."""
    d = dataset.n_features
    k = _check_parties(parties, d)
    spec = DATASET_SPECS.get(dataset.name)  # a table of one's own has none: column blocks
    if spec is not None and spec.whole_rows and dataset.image_shape is not None and dataset.image_shape[0] % k:
        rows = dataset.image_shape[0]
        divisors = ", ".join(str(n) for n in range(2, rows + 1) if rows % n == 0)
        raise DataError(f"parties={k}: {dataset.name} is split by pixel rows, so the number of parties must "
                        f"divide {rows} ({divisors})")
    tile = dict(spec.tiles).get(k) if spec is not None and dataset.image_shape is not None else None
    if tile is not None and (dataset.image_shape[0] // tile[0]) * (dataset.image_shape[1] // tile[1]) == k \
            and not dataset.image_shape[0] % tile[0] and not dataset.image_shape[1] % tile[1]:
        return _tiles(dataset.image_shape, tile)
    width = d // k
    return [np.arange(i * width, (i + 1) * width, dtype=np.int64) for i in range(k)]


def _tiles(image_shape: tuple[int, int], tile: tuple[int, int]) -> list[np.ndarray]:
    """Row-major rectangular tiles of an image, each as flattened pixel indices (row-major inside)."""
    rows, cols = image_shape
    th, tw = tile
    blocks = []
    for r in range(0, rows, th):
        for c in range(0, cols, tw):
            pixel_rows = np.arange(r, r + th)[:, None]
            pixel_cols = np.arange(c, c + tw)[None, :]
            blocks.append((pixel_rows * cols + pixel_cols).ravel().astype(np.int64))
    return blocks


def split_blocks(x: np.ndarray, blocks: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The per-party feature arrays of `x` (N, D): float32, C-contiguous copies."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise DataError(f"x must be a 2-D (samples, features) array, got shape {x.shape}")
    out = []
    for k, block in enumerate(blocks):
        index = np.asarray(block, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= x.shape[1]):
            raise DataError(f"block {k} indexes features outside 0..{x.shape[1] - 1}")
        out.append(np.ascontiguousarray(x[:, index], dtype=np.float32))
    return out
