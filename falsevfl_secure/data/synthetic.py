"""Synthetic vertical splits of any shape: a low-dimensional latent factor model observed through K blocks.
Used by the protocol-equivalence tests and the overhead benchmark, where K, the block width and the batch
size must be free; never for accuracy claims."""

from __future__ import annotations

import numpy as np

from .split import VerticalSplit


def synthetic_split(n: int = 64, parties: int = 3, width: int = 4, p_missing: float = 0.3, seed: int = 0,
                    n_classes: int = 3, regression: bool = False, n_labeled: int | None = None,
                    scale: float = 1.0, absent: tuple[int, ...] = ()) -> VerticalSplit:
    """A public, seeded split: every row has at least one observed party (before `absent`); the first
    `n_labeled` rows (default: all) are labeled; the features are multiplied by `scale` (magnitudes for the
    tests); the `absent` parties hold no row (a prediction that leaves them out)."""
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((n, 2))
    features = latent @ rng.standard_normal((2, parties * width)) + 0.3 * rng.standard_normal((n, parties * width))
    features = features * scale
    missing = rng.random((n, parties)) < p_missing
    missing[missing.all(axis=1), 0] = False
    missing[:, list(absent)] = True
    blocks = []
    for k in range(parties):
        block = features[:, k * width:(k + 1) * width].astype(np.float32)
        block[missing[:, k]] = 0.0
        blocks.append(block)
    if regression:
        y = (latent[:, 0] * 2.0 - latent[:, 1]).astype(np.float32)
    else:
        y = np.digitize(latent[:, 0], np.quantile(latent[:, 0], np.linspace(0, 1, n_classes + 1)[1:-1]))
    labeled = np.zeros(n, dtype=bool)
    labeled[: n if n_labeled is None else n_labeled] = True
    return VerticalSplit(blocks, missing, y, labeled, np.arange(n), 0, "synthetic")
