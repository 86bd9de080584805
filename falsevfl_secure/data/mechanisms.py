"""Missingness mechanisms: which parties hold which samples.

A mechanism turns the per-party feature arrays of N samples into a bool (N, K) mask, True =
party k does NOT hold sample i. The specs follow the paper ("Missing Mechanisms", Appendix "MAR
Mechanisms", "Robustness to data heterogeneity"):

- `mcar:P`     every (sample, party) missing independently with probability P;
- `mar1`       Algorithm "MAR Mechanism Type 1": visit parties in a random order, stop at the
               first piece whose variance exceeds the (decreasing) threshold T (1.1, step 0.15);
- `mar2[:B]`   Algorithm "MAR Mechanism Type 2": threshold T = 0.5 (step 0.15) and an
               excess-variance budget B (default 0.7; the paper uses 0.5 for ModelNet10);
- `mnar:P`     party k dropped with probability P if the mean of its values is < 0, else 1 - P;
- `dirichlet:A` heterogeneous MCAR: per-party rates p = K * 0.2 * omega, omega ~ Dir(A * 1),
               resampled while any p_k > 1; `dirichlet:inf` is exactly `mcar:0.2`.

Visited MAR pieces are observed, unvisited ones missing; the first visited piece is always
observed. The MAR and MNAR rules use the standardised values, as in the paper. All mechanisms are
vectorised over samples (the MAR loops run over the K visiting steps, not over samples) with the
same floating-point operations as the pseudocode, so `mar_visit` on one sample reproduces them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import DataError

MECHANISM_ROWS = ("all", "labeled")  # the rows a training mechanism removes blocks from (Config.mechanism_rows)
MAR1_THRESHOLD = 1.1
MAR2_THRESHOLD = 0.5
MAR2_BUDGET = 0.7
MAR_DELTA = 0.15
DIRICHLET_MEAN_RATE = 0.2
_DIRICHLET_MAX_TRIES = 100_000


def _check_blocks(blocks: Sequence[np.ndarray]) -> tuple[int, int]:
    if len(blocks) == 0:
        raise DataError("blocks: need at least one party's feature array")
    n = None
    for k, block in enumerate(blocks):
        shape = np.shape(block)
        if len(shape) != 2 or shape[1] == 0:
            raise DataError(f"blocks[{k}] must be a 2-D (samples, features>=1) array, got shape {shape}")
        if n is None:
            n = shape[0]
        elif shape[0] != n:
            raise DataError(f"blocks[{k}] has {shape[0]} rows, blocks[0] has {n}")
    return int(n), len(blocks)


def piece_variances(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """(N, K) float64: the population variance (np.var) of each sample's values in each piece."""
    _check_blocks(blocks)
    return np.stack([np.var(np.asarray(b, dtype=np.float64), axis=1) for b in blocks], axis=1)


def mar_visit(variances_in_visit_order: np.ndarray, kind: int, threshold: float | None = None,
              delta: float = MAR_DELTA, budget: float = MAR2_BUDGET) -> int:
    """The number of pieces one sample visits, by the paper's pseudocode, one piece at a time.

    Straight transcription of Algorithms mar-type1 (kind=1) and mar-type2 (kind=2), used by the
    tests to check the vectorised mechanism and available to anyone auditing a mask.
    """
    if kind not in (1, 2):
        raise DataError(f"kind must be 1 or 2 (MAR type), got {kind!r}")
    t = (MAR1_THRESHOLD if kind == 1 else MAR2_THRESHOLD) if threshold is None else threshold
    b = budget
    values = np.asarray(variances_in_visit_order, dtype=np.float64).ravel()
    for i, v in enumerate(values):
        if kind == 1:
            if v > t:
                return i + 1
        else:
            if v > t:
                b = b - (v - t)
            if b <= 0:
                return i + 1
        t = t - delta
    return len(values)


@dataclass(frozen=True)
class Mechanism:
    """Base class: `spec` is the canonical string; `sample` draws a bool (N, K) mask, True = missing."""

    spec: str

    def sample(self, blocks: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class MCAR(Mechanism):
    p: float = 0.2

    def sample(self, blocks: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        n, k = _check_blocks(blocks)
        return rng.random((n, k)) < self.p


@dataclass(frozen=True)
class MNAR(Mechanism):
    p: float = 0.7

    def sample(self, blocks: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        n, k = _check_blocks(blocks)
        means = np.stack([np.asarray(b, dtype=np.float64).mean(axis=1) for b in blocks], axis=1)
        rate = np.where(means < 0, self.p, 1.0 - self.p)
        return rng.random((n, k)) < rate


@dataclass(frozen=True)
class MAR(Mechanism):
    """MAR type 1 (kind=1) or type 2 (kind=2); the visiting order is drawn per sample from rng."""

    kind: int = 1
    threshold: float = MAR1_THRESHOLD
    delta: float = MAR_DELTA
    budget: float = MAR2_BUDGET

    def sample(self, blocks: Sequence[np.ndarray], rng: np.random.Generator,
               return_order: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The mask; with `return_order=True` also the (N, K) visiting order (party indices)."""
        n, k = _check_blocks(blocks)
        order = np.argsort(rng.random((n, k)), axis=1)
        ordered = np.take_along_axis(piece_variances(blocks), order, axis=1)
        visits = self.visits(ordered)
        observed_rank = np.arange(k)[None, :] < visits[:, None]
        missing = np.ones((n, k), dtype=bool)
        np.put_along_axis(missing, order, ~observed_rank, axis=1)
        return (missing, order) if return_order else missing

    def visits(self, ordered: np.ndarray) -> np.ndarray:
        """Pieces visited per sample, given the variances in visiting order: (N, K) -> (N,) in 1..K."""
        n, k = ordered.shape
        visits = np.full(n, k, dtype=np.int64)
        running = np.ones(n, dtype=bool)
        t = self.threshold
        b = np.full(n, self.budget)
        for j in range(k):
            v = ordered[:, j]
            if self.kind == 1:
                stop = v > t
            else:
                b = np.where(v > t, b - (v - t), b)
                stop = b <= 0
            stop &= running
            visits[stop] = j + 1
            running &= ~stop
            t = t - self.delta
        return visits


@dataclass(frozen=True)
class Dirichlet(Mechanism):
    """Heterogeneous MCAR: per-party rates K * mean_rate * omega, omega ~ Dirichlet(alpha * 1)."""

    alpha: float = math.inf
    mean_rate: float = DIRICHLET_MEAN_RATE

    def rates(self, parties: int, rng: np.random.Generator) -> np.ndarray:
        """The per-party missing rates (mean `mean_rate`, none above 1); no draw when alpha is inf."""
        if math.isinf(self.alpha):
            return np.full(parties, self.mean_rate)
        for _ in range(_DIRICHLET_MAX_TRIES):
            omega = rng.dirichlet(np.full(parties, self.alpha))
            rates = parties * self.mean_rate * omega
            if np.isfinite(rates).all() and rates.max() <= 1.0:
                return rates
        raise DataError(f"{self.spec}: no Dirichlet draw with every rate <= 1 "
                        f"in {_DIRICHLET_MAX_TRIES} tries")

    def sample(self, blocks: Sequence[np.ndarray], rng: np.random.Generator,
               return_rates: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The mask; with `return_rates=True` also the drawn per-party rates (to report them)."""
        n, k = _check_blocks(blocks)
        if math.isinf(self.alpha):  # exactly mcar:mean_rate, same mask for the same rng state
            missing = MCAR(f"mcar:{self.mean_rate:g}", self.mean_rate).sample(blocks, rng)
            rates = np.full(k, self.mean_rate)
        else:
            rates = self.rates(k, rng)
            missing = rng.random((n, k)) < rates[None, :]
        return (missing, rates) if return_rates else missing


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"mechanism {spec!r}: {text!r} is not a number") from None
    if math.isnan(value):
        raise DataError(f"mechanism {spec!r}: the parameter is NaN")
    return value


def _probability(text: str, spec: str) -> float:
    p = _number(text, spec)
    if not 0.0 <= p <= 1.0:
        raise DataError(f"mechanism {spec!r}: probability {p} is outside [0, 1]")
    return p


def parse_mechanism(spec: str | Mechanism) -> Mechanism:
    """`mcar:P`, `mar1`, `mar2` (or `mar2:B`), `mnar:P`, `dirichlet:ALPHA` (ALPHA > 0 or `inf`)."""
    if isinstance(spec, Mechanism):
        return spec
    if not isinstance(spec, str):
        raise DataError(f"mechanism spec must be a string, got {spec!r}")
    text = spec.strip().lower()
    name, _, arg = text.partition(":")
    name, arg = name.strip(), arg.strip()
    has_arg = ":" in text
    if name == "mcar" and has_arg:
        p = _probability(arg, spec)
        return MCAR(f"mcar:{p:g}", p)
    if name == "mnar" and has_arg:
        p = _probability(arg, spec)
        return MNAR(f"mnar:{p:g}", p)
    if name == "mar1" and not has_arg:
        return MAR("mar1", 1, MAR1_THRESHOLD)
    if name == "mar2":
        if not has_arg:
            return MAR("mar2", 2, MAR2_THRESHOLD)
        budget = _number(arg, spec)
        if not 0 < budget < math.inf:
            raise DataError(f"mechanism {spec!r}: the MAR-2 budget must be a positive finite number")
        canonical = "mar2" if budget == MAR2_BUDGET else f"mar2:{budget:g}"
        return MAR(canonical, 2, MAR2_THRESHOLD, budget=budget)
    if name == "dirichlet" and has_arg:
        alpha = _number(arg, spec)
        if not alpha > 0:
            raise DataError(f"mechanism {spec!r}: alpha must be > 0 (or inf), got {alpha}")
        return Dirichlet(f"dirichlet:{alpha:g}", alpha)
    raise DataError(f"unknown mechanism {spec!r}; valid: mcar:P, mar1, mar2, mar2:B, mnar:P, "
                    "dirichlet:ALPHA (P in [0, 1], ALPHA > 0 or inf)")
