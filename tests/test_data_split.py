"""Vertical splits: labeled draw, aligned reserve, mechanism, empty-row rule, no leaks, seeding."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_data_loaders import needs_isolet

from falsevfl_secure.data import (
    TEST_PATTERNS,
    TRAIN_MECHANISMS,
    DataError,
    feature_blocks,
    load_dataset,
    make_test_split,
    make_train_split,
)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _check_views(split, dataset, x):
    blocks = feature_blocks(dataset, split.parties)
    assert split.missing.shape == (split.n, split.parties) and split.missing.dtype == bool
    assert not split.missing.all(axis=1).any()  # the empty-row rule was applied
    assert np.array_equal(split.y, (dataset.y_train if x is dataset.x_train else dataset.y_test)[split.index])
    for k in range(split.parties):
        block, held = split.party_block(k)
        assert block.dtype == np.float32 and block.shape == (split.n, len(blocks[k]))
        assert np.array_equal(held, ~split.missing[:, k])
        assert np.all(block[~held] == 0.0)  # a party never holds values it does not have
        assert np.array_equal(block[held], x[split.index][:, blocks[k]][held])


def test_train_split_defaults(digits):
    split = make_train_split(digits, 4, "mcar:0.2", seed=0)
    assert split.labeled.sum() == 400 and split.aligned.sum() == 80  # the documented digits default
    assert not split.missing[split.aligned].any()  # the aligned reserve is fully observed
    assert np.all(split.labeled[split.aligned])
    assert split.mechanism == "mcar:0.2" and split.parties == 4
    _check_views(split, digits, digits.x_train)
    others = ~split.aligned
    assert abs(split.missing[others].mean() - 0.2) < 0.03


def test_mechanism_extremes(digits):
    none = make_train_split(digits, 4, "mcar:0", seed=1, n_labeled=100, n_aligned=30)
    assert none.n == len(digits.y_train) and none.dropped == 0 and not none.missing.any()
    everything = make_train_split(digits, 4, "mcar:1", seed=1, n_labeled=100, n_aligned=30)
    assert everything.n == 30 and everything.dropped == len(digits.y_train) - 30
    assert everything.aligned.all() and everything.labeled.all() and not everything.missing.any()
    test = make_test_split(digits, 4, "mcar:1", seed=1)
    assert test.n == 0 and test.dropped == len(digits.y_test)


def test_empty_row_rule_counts_and_logs(digits, caplog):
    with caplog.at_level(logging.INFO, logger="falsevfl_secure.data.split"):
        split = make_test_split(digits, 8, "mcar:0.6", seed=2)
    # recompute: with p = 0.6 and K = 8, about 0.6^8 = 1.7% of the rows have no observed party
    assert split.dropped > 0 and split.n + split.dropped == len(digits.y_test)
    assert len(np.setdiff1d(np.arange(len(digits.y_test)), split.index)) == split.dropped
    assert "empty-row rule" in caplog.text and str(split.dropped) in caplog.text
    _check_views(split, digits, digits.x_test)
    assert split.labeled.all() and not split.aligned.any()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), mechanism=st.sampled_from(TRAIN_MECHANISMS + ("dirichlet:1",)),
       k=st.sampled_from([2, 4, 8]))
def test_train_split_properties(digits, seed, mechanism, k):
    split = make_train_split(digits, k, mechanism, seed, n_labeled=120, n_aligned=25)
    assert split.aligned.sum() == 25 and not split.missing[split.aligned].any()
    assert split.labeled.sum() + int((~split.labeled).sum()) == split.n
    assert split.labeled.sum() <= 120 and split.n + split.dropped == len(digits.y_train)
    _check_views(split, digits, digits.x_train)
    again = make_train_split(digits, k, mechanism, seed, n_labeled=120, n_aligned=25)
    assert np.array_equal(split.missing, again.missing) and np.array_equal(split.index, again.index)
    assert all(np.array_equal(a, b) for a, b in zip(split.blocks, again.blocks, strict=True))


def test_labeled_draw_independent_of_mechanism(digits):
    a = make_train_split(digits, 4, "mcar:0", seed=5)
    b = make_train_split(digits, 4, "mnar:0.7", seed=5)
    labeled_a = a.index[a.labeled]
    labeled_b = b.index[b.labeled]
    assert set(labeled_b) <= set(labeled_a)  # same draw, minus rows the empty-row rule removed
    assert np.array_equal(a.index[a.aligned], b.index[b.aligned])
    c = make_train_split(digits, 4, "mcar:0", seed=6)
    assert not np.array_equal(labeled_a, c.index[c.labeled])


def test_test_split_independent_of_train_stream(digits):
    train = make_train_split(digits, 8, "mcar:0.5", seed=0, n_labeled=0, n_aligned=0)
    test = make_test_split(digits, 8, "mcar:0.5", seed=0)
    n = min(train.n, test.n)
    assert not np.array_equal(train.missing[:n], test.missing[:n])
    again = make_test_split(digits, 8, "mcar:0.5", seed=0)
    assert np.array_equal(test.missing, again.missing)
    other = make_test_split(digits, 8, "mcar:0.5", seed=1)
    assert not np.array_equal(test.missing[:min(test.n, other.n)], other.missing[:min(test.n, other.n)])


def test_dirichlet_rates_reported(digits):
    split = make_train_split(digits, 8, "dirichlet:1", seed=0)
    assert split.party_rates is not None and split.party_rates.shape == (8,)
    assert np.isclose(split.party_rates.mean(), 0.2) and split.party_rates.max() <= 1


def test_bad_arguments(digits, refused):
    with pytest.raises(DataError, match="n_aligned"):
        make_train_split(digits, 4, "mcar:0.2", 0, n_labeled=10, n_aligned=20)
    refused("split")
    with pytest.raises(DataError, match="n_labeled"):
        make_train_split(digits, 4, "mcar:0.2", 0, n_labeled=10**6)
    refused("split")
    with pytest.raises(DataError, match="unknown mechanism"):
        make_test_split(digits, 4, "mcar0.2", 0)
    refused("split")
    split = make_test_split(digits, 4, "mcar:0.2", 0)
    with pytest.raises(DataError, match="party 4"):
        split.party_block(4)
    refused("split")


@needs_isolet
def test_isolet_test_patterns():
    isolet = load_dataset("isolet")
    train = make_train_split(isolet, 8, "mar1", seed=0)
    assert train.labeled.sum() == 500 and train.aligned.sum() == 100
    for pattern in TEST_PATTERNS:
        split = make_test_split(isolet, 8, pattern, seed=0)
        assert split.n + split.dropped == 1559
        assert not split.missing.all(axis=1).any()
        for k in range(8):
            assert np.all(split.blocks[k][split.missing[:, k]] == 0)
