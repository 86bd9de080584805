"""Missingness mechanisms: rates, the paper's MAR stopping rules on every sample, reproducibility, specs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.data import MAR, DataError, mar_visit, parse_mechanism, piece_variances

SETTINGS = settings(max_examples=30, deadline=None)


def _blocks(seed: int, n: int, k: int, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    widths = rng.integers(1, 12, size=k)
    # per-sample scales spread the variances around the MAR thresholds
    sample_scale = rng.uniform(0.2, 1.6, size=(n, 1)) * scale
    return [(rng.standard_normal((n, int(w))) * sample_scale + rng.normal(0, 0.5, (n, 1))).astype(np.float32)
            for w in widths]


def _within_binomial(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1e-9


@SETTINGS
@given(seed=st.integers(0, 2**31), k=st.integers(2, 8), p=st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.9, 1.0]))
def test_mcar_rate(seed, k, p):
    blocks = _blocks(seed, 2000, k)
    mask = parse_mechanism(f"mcar:{p}").sample(blocks, np.random.default_rng(seed))
    assert mask.shape == (2000, k) and mask.dtype == bool
    assert _within_binomial(int(mask.sum()), mask.size, p)


def _reference_mar(variances: np.ndarray, rng: np.random.Generator,
                   kind: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent per-sample transcription of the paper's pseudocode, consuming rng like the mechanism
    (one uniform per (sample, party); the visiting order is their argsort)."""
    n, k = variances.shape
    keys = rng.random((n, k))
    missing = np.ones((n, k), dtype=bool)
    for i in range(n):
        t, b = (1.1, None) if kind == 1 else (0.5, 0.7)
        for piece in np.argsort(keys[i]):
            missing[i, piece] = False  # visited = observed
            v = variances[i, piece]
            if kind == 1:
                if v > t:
                    break
            else:
                if v > t:
                    b -= v - t
                if b <= 0:
                    break
            t -= 0.15
    return missing, keys


@SETTINGS
@given(seed=st.integers(0, 2**31), k=st.integers(1, 8), kind=st.sampled_from([1, 2]))
def test_mar_matches_pseudocode(seed, k, kind):
    blocks = _blocks(seed, 300, k)
    mech = parse_mechanism(f"mar{kind}")
    mask, order = mech.sample(blocks, np.random.default_rng(seed), return_order=True)
    variances = np.stack([np.array([np.var(row.astype(np.float64)) for row in b]) for b in blocks], axis=1)
    assert np.allclose(variances, piece_variances(blocks), rtol=1e-9, atol=1e-12)
    expected, keys = _reference_mar(piece_variances(blocks), np.random.default_rng(seed), kind)
    assert np.array_equal(order, np.argsort(keys, axis=1))
    assert np.array_equal(mask, expected)
    exact = piece_variances(blocks)
    for i in range(len(mask)):
        visited = mar_visit(exact[i, order[i]], kind)
        observed = ~mask[i]
        assert observed.sum() == visited >= 1
        assert observed[order[i][0]]  # the first visited piece is always observed
        assert np.all(observed[order[i][:visited]]) and not np.any(observed[order[i][visited:]])
        # structural check: the last visited piece met the stopping rule, the earlier ones did not
        ordered = exact[i, order[i]]
        thresholds = (1.1 if kind == 1 else 0.5) - 0.15 * np.arange(k)
        if kind == 1:
            met = ordered > thresholds
        else:
            met = 0.7 - np.cumsum(np.maximum(ordered - thresholds, 0.0)) <= 0
        assert not np.any(met[:visited - 1])
        assert visited == k or met[visited - 1]


def test_mar_visit_rules():
    assert mar_visit(np.array([2.0, 0.0, 0.0]), 1) == 1
    assert mar_visit(np.array([1.0, 0.96, 5.0]), 1) == 2  # 0.96 > 1.1 - 0.15
    assert mar_visit(np.array([0.0, 0.0, 0.0]), 1) == 3
    assert mar_visit(np.array([1.3, 0.0]), 2) == 1  # budget 0.7 - (1.3 - 0.5) < 0
    assert mar_visit(np.array([0.9, 0.65, 0.0]), 2) == 2  # 0.7 - 0.4 = 0.3; 0.3 - (0.65 - 0.35) = 0
    assert mar_visit(np.array([0.9, 0.5, 0.0, 0.0]), 2, budget=1.0) == 4
    with pytest.raises(DataError):
        mar_visit(np.zeros(3), 3)


def test_mar2_budget_field():
    assert parse_mechanism("mar2") == MAR("mar2", 2, 0.5, budget=0.7)
    assert parse_mechanism("mar2:0.5").budget == 0.5


@SETTINGS
@given(seed=st.integers(0, 2**31), k=st.integers(2, 6), p=st.sampled_from([0.7, 0.9, 0.5]))
def test_mnar_conditional_rates(seed, k, p):
    blocks = _blocks(seed, 3000, k)
    mask = parse_mechanism(f"mnar:{p}").sample(blocks, np.random.default_rng(seed))
    negative = np.stack([b.astype(np.float64).mean(axis=1) < 0 for b in blocks], axis=1)
    for condition, rate in ((negative, p), (~negative, 1 - p)):
        n = int(condition.sum())
        if n:
            assert _within_binomial(int(mask[condition].sum()), n, rate)


@SETTINGS
@given(seed=st.integers(0, 2**31),
       spec=st.sampled_from(["mcar:0.3", "mar1", "mar2", "mnar:0.7", "dirichlet:1"]))
def test_reproducible(seed, spec):
    blocks = _blocks(seed, 200, 5)
    mech = parse_mechanism(spec)
    a = mech.sample(blocks, np.random.default_rng(seed))
    b = mech.sample(blocks, np.random.default_rng(seed))
    assert np.array_equal(a, b)


@SETTINGS
@given(seed=st.integers(0, 2**31), k=st.integers(2, 8))
def test_dirichlet_inf_is_mcar02(seed, k):
    blocks = _blocks(seed, 500, k)
    a = parse_mechanism("dirichlet:inf").sample(blocks, np.random.default_rng(seed))
    b = parse_mechanism("mcar:0.2").sample(blocks, np.random.default_rng(seed))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("alpha", [10.0, 1.0, 0.1])
def test_dirichlet_rates(alpha):
    mech = parse_mechanism(f"dirichlet:{alpha}")
    rng = np.random.default_rng(0)
    rates = np.stack([mech.rates(8, rng) for _ in range(300)])
    assert np.all(rates <= 1.0) and np.all(rates >= 0.0)
    assert np.allclose(rates.mean(axis=1), 0.2)  # = 1.6 * omega, omega on the simplex
    blocks = _blocks(1, 20000, 8)
    mask, drawn = mech.sample(blocks, np.random.default_rng(3), return_rates=True)
    for k in range(8):
        assert _within_binomial(int(mask[:, k].sum()), 20000, float(np.clip(drawn[k], 1e-12, 1 - 1e-12)), 6)


@pytest.mark.parametrize("spec", ["mcar", "mcar:", "mcar:x", "mcar:1.5", "mcar:-0.1", "mcar:nan", "mnar:2",
                                  "mar3", "mar1:0.2", "dirichlet:0", "dirichlet:-1", "dirichlet:abc", "foo:1",
                                  "", "mar2:0"])
def test_bad_specs(spec, refused):
    with pytest.raises(DataError):
        parse_mechanism(spec)
    refused("mechanism")


def test_canonical_specs():
    assert parse_mechanism(" MCAR:0.20 ").spec == "mcar:0.2"
    assert parse_mechanism("mcar:0").spec == "mcar:0"
    assert parse_mechanism("mnar:0.9").spec == "mnar:0.9"
    assert parse_mechanism("dirichlet:inf").spec == "dirichlet:inf"
    assert parse_mechanism("dirichlet:10").spec == "dirichlet:10"
    assert parse_mechanism("mar1").spec == "mar1"


def test_bad_blocks(refused):
    with pytest.raises(DataError):
        parse_mechanism("mcar:0.2").sample([], np.random.default_rng(0))
    refused("mechanism")
    with pytest.raises(DataError, match="rows"):
        parse_mechanism("mar1").sample([np.zeros((3, 2)), np.zeros((4, 2))], np.random.default_rng(0))
    refused("mechanism")
