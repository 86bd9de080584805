"""Standardizer: closed-form statistics, training-row subsets, the range floor, constant features,
the clip bound at any magnitude, the JSON round trip, and a DataError for every bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from falsevfl_secure.data import DataError
from falsevfl_secure.data import standardize as standardize_module
from falsevfl_secure.data.standardize import DEFAULT_CLIP, Standardizer

SETTINGS = settings(max_examples=60, deadline=None)


def _matrices(max_value: float, min_rows: int = 1):
    """2-D float64 arrays of finite values within +-max_value (none so tiny that statistics would underflow)."""
    shapes = hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=12).filter(lambda s: s[0] >= min_rows)
    values = st.floats(-max_value, max_value, allow_nan=False, allow_infinity=False).map(
        lambda v: v if abs(v) > 1e-200 else 0.0)
    return hnp.arrays(np.float64, shapes, elements=values)


def test_closed_form_mean_std_and_transform():
    x = np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 30.0], [4.0, 30.0]])
    s = Standardizer.fit(x)
    assert s.mean.tolist() == [2.5, 20.0]
    assert s.scale == pytest.approx([math.sqrt(1.25), 10.0])
    z = s.transform(np.array([[5.0, 0.0]]))
    assert z.dtype == np.float32 and z.shape == (1, 2)
    assert z[0] == pytest.approx([2.5 / math.sqrt(1.25), -2.0], rel=1e-6)
    assert s.clip == DEFAULT_CLIP == 10.0


def test_range_floor_bounds_a_near_constant_feature():
    # 99 zeros and one 10: std = sqrt(0.99) < 10 / clip, so the scale is the floor 1.0.
    x = np.zeros((100, 1))
    x[0, 0] = 10.0
    s = Standardizer.fit(x)
    assert s.mean[0] == pytest.approx(0.1)
    assert s.scale[0] == pytest.approx(1.0)
    z = s.transform(np.array([[10.0], [1000.0], [-1e6]]))
    assert z[:, 0] == pytest.approx([9.9, 10.0, -10.0], rel=1e-6)
    plain = Standardizer.fit(x, min_scale_fraction=0.0)
    assert plain.scale[0] == pytest.approx(math.sqrt(0.99))


def test_explicit_floor_and_clip():
    x = np.zeros((100, 1))
    x[0, 0] = 10.0
    s = Standardizer.fit(x, min_scale_fraction=0.5, clip=3.0)
    assert s.scale[0] == pytest.approx(5.0) and s.clip == 3.0
    assert s.transform(np.array([[10.0], [20.0]]))[:, 0] == pytest.approx([(10 - 0.1) / 5.0, 3.0], rel=1e-6)
    assert Standardizer.fit(x, clip=5.0).scale[0] == pytest.approx(2.0)  # default floor fraction is 1/clip


def test_rows_subset_uses_only_those_rows():
    x = np.array([[0.0], [100.0], [2.0], [-50.0], [4.0]])
    by_index = Standardizer.fit(x, np.array([0, 2, 4]))
    by_mask = Standardizer.fit(x, np.array([True, False, True, False, True]))
    for s in (by_index, by_mask):
        assert s.mean[0] == pytest.approx(2.0)
        assert s.scale[0] == pytest.approx(math.sqrt(8 / 3))


def test_constant_columns_map_to_zero():
    x = np.array([[7.0, 1.0], [7.0, 2.0], [7.0, 3.0]])
    s = Standardizer.fit(x)
    assert s.scale[0] == 0.0 and s.mean[0] == 7.0
    z = s.transform(np.array([[7.0, 2.0], [1e30, 2.0], [-3.0, 2.0]]))
    assert z[:, 0].tolist() == [0.0, 0.0, 0.0]
    single = Standardizer.fit(np.array([[1.0, -2.0, 3.0]]))
    assert single.scale.tolist() == [0.0, 0.0, 0.0]


def test_json_round_trip():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4)) * [1, 1e-3, 1e5, 0]
    s = Standardizer.fit(x, clip=7.5)
    d = json.loads(json.dumps(s.to_dict()))
    back = Standardizer.from_dict(d)
    assert np.array_equal(back.mean, s.mean) and np.array_equal(back.scale, s.scale) and back.clip == 7.5
    probe = rng.normal(size=(9, 4)) * 1e3
    assert np.array_equal(back.transform(probe), s.transform(probe))


def test_arrays_are_read_only():
    s = Standardizer.fit(np.array([[1.0], [2.0]]))
    with pytest.raises(ValueError):
        s.mean[0] = 3.0


def test_chunked_statistics_match_unchunked(monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, size=(41, 3))
    whole = Standardizer.fit(x)
    monkeypatch.setattr(standardize_module, "_CHUNK", 4)
    chunked = Standardizer.fit(x)
    assert np.allclose(chunked.mean, whole.mean, rtol=1e-12) and np.allclose(chunked.scale, whole.scale, rtol=1e-12)
    assert np.allclose(chunked.transform(x), whole.transform(x), atol=1e-6)


@SETTINGS
@given(_matrices(1e6), st.floats(0.5, 50.0))
def test_statistics_match_numpy(x, clip):
    s = Standardizer.fit(x, clip=clip)
    span = x.max(axis=0) - x.min(axis=0)
    assert np.allclose(s.mean, x.mean(axis=0), rtol=1e-9, atol=1e-9 * np.abs(x).max(initial=0))
    expected = np.maximum(x.std(axis=0), span / clip)
    varying = s.scale > 0
    assert np.allclose(s.scale[varying], expected[varying], rtol=1e-7)
    assert np.all(span[~varying] <= 1e-12 * np.abs(x).max(axis=0)[~varying])


@SETTINGS
@given(_matrices(1e30), _matrices(1e30), st.floats(0.1, 100.0))
def test_clip_bound_holds_at_any_magnitude(train, probe, clip):
    s = Standardizer.fit(train, clip=clip)
    probe = probe[:, :1].repeat(train.shape[1], axis=1)
    for z in (s.transform(probe), s.transform(train), s.transform(probe * 0 + 1e30), s.transform(probe * 0 - 1e30)):
        assert z.dtype == np.float32 and np.isfinite(z).all()
        assert np.abs(z).max() <= np.float32(clip)


@SETTINGS
@given(_matrices(1e6, min_rows=2), st.floats(1.0, 40.0))
def test_training_values_are_never_clipped(x, clip):
    # With the default floor (range / clip) every training value lies within clip of 0 before clipping.
    s = Standardizer.fit(x, clip=clip)
    varying = s.scale > 0
    unclipped = (x[:, varying] - s.mean[varying]) / s.scale[varying]
    assert np.abs(unclipped).max(initial=0) <= clip * (1 + 1e-9)


@SETTINGS
@given(_matrices(1e3, min_rows=2), st.integers(0, 40))
def test_transform_is_unchanged_by_rescaling_a_column(x, power):
    # The floor is per feature, so units (metres vs km) do not change the standardised values;
    # a power-of-two factor is exact in floating point, so the results are identical.
    factor = 2.0 ** power
    a = Standardizer.fit(x)
    b = Standardizer.fit(x * factor)
    assert np.array_equal(a.transform(x), b.transform(x * factor))


def test_transform_is_unchanged_by_shifting_a_column():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 3)) * [1.0, 5.0, 0.01]
    a, b = Standardizer.fit(x), Standardizer.fit(x + 1000.0)
    assert np.allclose(a.transform(x), b.transform(x + 1000.0), atol=1e-5)


def test_digits_clip_touches_only_test_outliers():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x_train, x_test = train_test_split(bunch.data.astype(np.float64), test_size=0.25, stratify=bunch.target,
                                       random_state=0)
    s = Standardizer.fit(x_train)
    assert np.abs(s.transform(x_train)).max() < s.clip
    clipped = np.abs(s.transform(x_test)) >= s.clip
    assert clipped.mean() < 1e-3
    lo, hi = x_train.min(axis=0), x_train.max(axis=0)
    rows, cols = np.nonzero(clipped)
    assert np.all((x_test[rows, cols] < lo[cols]) | (x_test[rows, cols] > hi[cols]))  # only unseen values


BAD_DICTS = [
    ([1.0], "expected a mapping"),
    ({"mean": [0.0], "scale": [1.0]}, "missing key(s) clip"),
    ({"scale": [1.0], "clip": 10}, "missing key(s) mean"),
    ({"mean": [0.0, 1.0], "scale": [1.0], "clip": 10}, "mean has 2 features but scale has 1"),
    ({"mean": [], "scale": [], "clip": 10}, "non-empty"),
    ({"mean": [[0.0]], "scale": [[1.0]], "clip": 10}, "flat list of numbers"),
    ({"mean": ["0"], "scale": [1.0], "clip": 10}, "mean must be a flat list of numbers"),
    ({"mean": [True], "scale": [1.0], "clip": 10}, "mean must be a flat list of numbers"),
    ({"mean": "0", "scale": [1.0], "clip": 10}, "mean must be a flat list of numbers"),
    ({"mean": [0.0, float("nan")], "scale": [1.0, 1.0], "clip": 10}, "mean of feature 1 is not finite"),
    ({"mean": [0.0], "scale": [float("inf")], "clip": 10}, "scale of feature 0 is not finite"),
    ({"mean": [0.0], "scale": [-1.0], "clip": 10}, "scale of feature 0 is negative"),
    ({"mean": [0.0], "scale": [1.0], "clip": 0}, "clip must be a finite number > 0"),
    ({"mean": [0.0], "scale": [1.0], "clip": float("inf")}, "clip must be a finite number > 0"),
    ({"mean": [0.0], "scale": [1.0], "clip": "10"}, "clip must be a number"),
    ({"mean": [0.0], "scale": [1.0], "clip": True}, "clip must be a number"),
]


@pytest.mark.parametrize(("d", "message"), BAD_DICTS)
def test_from_dict_refuses_bad_input(d, message, refused):
    with pytest.raises(DataError, match="standardizer") as info:
        Standardizer.from_dict(d)
    assert message in str(info.value)
    refused("standardizer")


X = np.arange(6.0).reshape(3, 2)
BAD_FITS = [
    (dict(x=np.arange(3.0)), "2-D"),
    (dict(x=np.array([["a", "b"]])), "must be numbers"),
    (dict(x=np.array([[1.0, np.nan]])), "row 0, feature 1 is not finite"),
    (dict(x=X, rows=np.zeros(3, dtype=bool)), "no rows to fit on"),
    (dict(x=X, rows=np.array([], dtype=np.int64)), "no rows to fit on"),
    (dict(x=X, rows=np.ones(4, dtype=bool)), "row mask has shape (4,)"),
    (dict(x=X, rows=np.array([0, 3])), "row indices must lie in 0..2"),
    (dict(x=X, rows=np.array([-1])), "row indices must lie in 0..2"),
    (dict(x=X, rows=np.array([0.5])), "bool mask or 1-D integer"),
    (dict(x=X, clip=0.0), "clip must be a finite number > 0"),
    (dict(x=X, clip=-1.0), "clip must be a finite number > 0"),
    (dict(x=X, min_scale_fraction=-0.1), "min_scale_fraction"),
    (dict(x=X, min_scale_fraction=float("nan")), "min_scale_fraction"),
    (dict(x=np.array([[1e308], [-1e308]]), min_scale_fraction=1.0), "too large to standardise"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_FITS)
def test_fit_refuses_bad_input(kwargs, message, refused):
    with pytest.raises(DataError, match="standardizer") as info:
        Standardizer.fit(**kwargs)
    assert message in str(info.value)
    refused("standardizer")


@pytest.mark.parametrize(("x", "message"), [
    (np.zeros((2, 3)), "fitted on 2 features, got 3"),
    (np.zeros(2), "2-D"),
    (np.array([[0.0, np.inf]]), "row 0, feature 1 is not finite"),
    (np.array([[None, 1.0]]), "must be numbers"),
])
def test_transform_refuses_bad_input(x, message, refused):
    s = Standardizer.fit(X)
    with pytest.raises(DataError, match="standardizer") as info:
        s.transform(x)
    assert message in str(info.value)
    refused("standardizer")
