"""Vertical partition: the paper's feature splits, disjoint contiguous blocks, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from test_data_loaders import needs_fmnist, needs_isolet, write_hapt

from falsevfl_secure.data import DataError, Dataset, feature_blocks, load_dataset, split_blocks


def _contiguous_disjoint(blocks, width):
    seen = np.concatenate(blocks)
    assert len(np.unique(seen)) == len(seen)
    for block in blocks:
        assert len(block) == width
        assert np.all(np.diff(block) == 1)
    starts = [int(b[0]) for b in blocks]
    assert starts == sorted(starts)


@needs_isolet
def test_isolet_8x77():
    data = load_dataset("isolet")
    blocks = feature_blocks(data, 8)
    _contiguous_disjoint(blocks, 77)
    assert blocks[0][0] == 0 and blocks[-1][-1] == 615  # feature 616 discarded
    parts = split_blocks(data.x_train, blocks)
    assert all(p.dtype == np.float32 and p.flags.c_contiguous and p.shape == (6238, 77) for p in parts)
    assert np.array_equal(parts[3], data.x_train[:, 231:308])


def test_hapt_8x70(tmp_path):
    data = load_dataset("hapt", root=write_hapt(tmp_path, n_train=12, n_test=12))
    blocks = feature_blocks(data, 8)
    _contiguous_disjoint(blocks, 70)
    assert blocks[-1][-1] == 559


@needs_fmnist
def test_fashion_mnist_tiles():
    data = load_dataset("fashion-mnist")
    blocks = feature_blocks(data, 8)
    assert len(blocks) == 8
    covered = np.zeros(784, dtype=int)
    for t, block in enumerate(blocks):
        assert len(block) == 98
        covered[block] += 1
        rows, cols = np.divmod(block, 28)
        assert rows.max() - rows.min() == 13 and cols.max() - cols.min() == 6
        assert rows.min() == 14 * (t // 4) and cols.min() == 7 * (t % 4)  # 2 x 4 grid, row-major
        assert set(zip(rows.tolist(), cols.tolist(), strict=True)) == {
            (r, c) for r in range(rows.min(), rows.min() + 14) for c in range(cols.min(), cols.min() + 7)}
    assert np.all(covered == 1)
    _contiguous_disjoint(feature_blocks(data, 4), 196)  # other K: bands


@pytest.mark.parametrize("k", [2, 4, 8])
def test_digits_rows(k):
    data = load_dataset("digits")
    blocks = feature_blocks(data, k)
    _contiguous_disjoint(blocks, 64 // k)
    for i, block in enumerate(blocks):
        assert set(np.unique(block // 8)) == set(range(i * 8 // k, (i + 1) * 8 // k))


def test_bad_party_counts(refused):
    digits = load_dataset("digits")
    with pytest.raises(DataError, match="divide"):
        feature_blocks(digits, 3)
    refused("partition")
    with pytest.raises(DataError, match="at least 2"):
        feature_blocks(digits, 1)
    refused("partition")
    tiny = Dataset("tiny", np.zeros((4, 5), np.float32), np.zeros(4, np.int64), np.zeros((2, 5), np.float32),
                   np.zeros(2, np.int64), 2, None)
    with pytest.raises(DataError, match="exceeds the number of features"):
        feature_blocks(tiny, 6)
    refused("partition")
    assert [len(b) for b in feature_blocks(tiny, 5)] == [1] * 5
