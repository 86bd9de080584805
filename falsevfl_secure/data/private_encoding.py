"""A party's encoding released with differential privacy, for training under a privacy budget.

The clear encoding (`encoding.fit_encoding`) is fitted on every row the party holds: one more row moves every
other row's standardised inputs (a row of 1000 among N(0, 1) values moves them by up to 3.9) and can add a
category, hence an input column, so every later release about the other rows depends on it uncounted. Here the
statistics the encoding needs come from two Gaussian mechanisms over the party's own rows, noised with exact
discrete Gaussian draws from its own secret stream, and charged to its own ledger (privacy.py) before any
release that uses them:

1. A count per public bin of each numeric column (bins over +-[1e-4, 1e12], 4 a decade, and one around 0) and
   a count per category of each categorical column: a row adds 1 to one count of each column it has a value in,
   so the L2 sensitivity is sqrt(columns) and the noise sigma = multiplier x sqrt(columns). A numeric column's
   range is the span of the bins whose noisy count clears a level that noise alone reaches in any of the
   party's empty bins with probability FALSE_BINS; a category is kept when its noisy count clears a threshold T
   that a category held by one row clears with probability at most `delta` over all the party's categorical
   columns (the threshold's delta, added to the ledger). Its share is its noisy count's. Every categorical
   column also has the OTHER cell, whatever the rows: a value not released is observed there, so which rows a
   party holds (and lists in the alignment) does not depend on the release.
2. Per numeric column, over its range mapped to u in [-1, 1] (values outside clipped): the count, the sum of u
   and of u^2, each row's rounded to a grid of 1 / GRID, so a row moves each column's three numbers by at most
   sqrt(3) x GRID: sigma = multiplier x sqrt(3 x numeric columns) x GRID. The centre is the noisy mean; the
   scale the noisy standard deviation, floored at the range / (16 x clip) (noise can take it to 0 or below).

Binary detection is off (a two-valued column is numeric): which columns hold two values is the rows' fact.
A row whose every cell is missing adds nothing. Everything after the two releases is post-processing.

What it costs (tests/test_private_encoding.py): values that fewer rows hold than the range's level (about 5
sigma per bin) fall outside the range and are clipped there for the statistics, so a sparse column (a pixel
that is 0 in 99 % of rows) is standardised by its bulk and its rare values reach the clip; a column whose
spread is a few percent of its magnitude or less (a year of sale) has a variance of the order of the noise on
its second moment, so its scale is noisy and often floored, and its standardised values vary less than they
should.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy.special import ndtri

from .encoding import OTHER, Encoding, _check, _check_size, refuse_empty
from .standardize import DEFAULT_CLIP, Standardizer
from .tables import PartyTable

RELEASES = 2  # the two Gaussian mechanisms above
_MAGNITUDES = 10.0 ** (np.arange(-16, 49) / 4)  # 1e-4 .. 1e12, 4 a decade: the range needs no finer
EDGES = np.concatenate([-_MAGNITUDES[::-1], _MAGNITUDES])  # public bins; beyond either end counts in the end bin
GRID = 4096  # the sums' grid: u and u^2 are rounded to a 4096th (the noise, in u, does not depend on it)
FALSE_BINS = 1e-6  # the chance that noise alone puts any empty bin of a party's columns in their ranges


@dataclass(frozen=True)
class EncodingRelease:
    """What a party's private encoding released, for its ledger: `releases` Gaussian mechanisms of `multiplier`
    and the categories' threshold `delta` (0 without categorical columns); `threshold`: the noisy count a
    category needed."""

    multiplier: float
    delta: float = 0.0
    threshold: float = 0.0
    releases: int = RELEASES
    dropped: int = 0  # categories whose noisy count missed the threshold (encoded in the OTHER cell)
    reused: bool = False  # kept from an earlier run over the same table (charged when it was drawn)

    def line(self, party: str) -> str:
        """What the party's own user reads when its training starts."""
        kept = (f"; a category needed a noisy count of {self.threshold:.0f} rows, {self.dropped} fell short and "
                f"read as {OTHER!r}" if self.threshold else "")
        how = "the one released for this table before, charged then" if self.reused else "charged"
        return f"{party}: encoding released with DP (noise multiplier {self.multiplier:.3g}, {how}){kept}"

    @property
    def event(self) -> tuple[float, int]:
        return (self.multiplier, self.releases)

    def plausible(self) -> bool:
        """Every field of the kind and range a release writes (a kept file read back is checked with it)."""
        numbers = (self.multiplier, self.delta, self.threshold)
        return (all(type(v) in (int, float) and math.isfinite(v) for v in numbers) and self.multiplier > 0
                and 0 <= self.delta < 1 and self.threshold >= 0 and type(self.releases) is int
                and type(self.dropped) is int and self.dropped >= 0 and type(self.reused) is bool)


def variance(multiplier: float, squared_sensitivity: int) -> int:
    """The discrete Gaussian's variance for noise of at least `multiplier` x sqrt(`squared_sensitivity`) standard
    deviation: ceil(multiplier^2 x squared_sensitivity), exactly (a float square may round up past an integer)."""
    return max(1, math.ceil(Fraction(multiplier) ** 2 * int(squared_sensitivity)))


def noisy(counts: np.ndarray, var: int, stream) -> np.ndarray:
    """Integer `counts` plus exact discrete Gaussian noise of variance `var` from `stream` (float64)."""
    from ..secure.discrete_gaussian import discrete_gaussian  # torch, for the stream's type: only under a budget

    flat = np.asarray(counts, dtype=np.int64).ravel()
    return (flat + discrete_gaussian(var, flat.size, stream)).astype(np.float64).reshape(np.shape(counts))


def category_threshold(var: int, delta: float, columns: int) -> float:
    """The noisy count T a category needs: a category held by one row (count 1) clears T in any of `columns`
    columns with probability at most columns x P(noise >= T - 1) <= delta. The discrete Gaussian's tail from
    T - 1 is at most the continuous one's from T - 2 (its normaliser is at least sqrt(2 pi var))."""
    return 2.0 - math.sqrt(var) * float(ndtri(delta / max(columns, 1)))  # ndtri(p) < 0: its tail, to any p


def bin_counts(x: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """(columns, EDGES.size + 1) counts of the observed cells per public bin: a row adds 1 per observed cell."""
    bins = np.where(observed, np.searchsorted(EDGES, x, side="right"), -1)
    return np.stack([np.bincount(bins[:, j][bins[:, j] >= 0], minlength=EDGES.size + 1) for j in range(x.shape[1])])


def moment_sums(x: np.ndarray, observed: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """(3, columns) integers: GRID x the count, and the sums of GRID u and of GRID u^2 (each rounded), for u the
    observed cells mapped from [low, high] to [-1, 1] and clipped: a row moves each column's three by <= GRID."""
    mid, half = (low + high) / 2, (high - low) / 2
    u = np.clip((np.asarray(x, dtype=np.float64) - mid) / half, -1.0, 1.0)
    first = np.where(observed, np.rint(u * GRID), 0).astype(np.int64)
    second = np.where(observed, np.rint(u * u * GRID), 0).astype(np.int64)
    return np.stack([observed.sum(axis=0) * GRID, first.sum(axis=0), second.sum(axis=0)])


def private_encoding(table: PartyTable, multiplier: float, delta: float, stream,
                     clip: float = DEFAULT_CLIP) -> tuple[Encoding, EncodingRelease]:
    """The encoding of `table` from two Gaussian mechanisms of `multiplier` (module docstring) with noise from
    the party's own secret `stream`; `delta` bounds the chance a category held by one row is kept."""
    observed = refuse_local(table)
    numeric = [j for j, name in enumerate(table.columns) if name not in table.text]
    var = variance(multiplier, len(table.columns))  # one count per column a row has a value in
    categories, shares, threshold, dropped = _categories(table, var, delta, stream)
    scaler = None
    if numeric:
        x, seen = table.x[:, numeric], observed[:, numeric]
        scaler = private_scaler(x, seen, multiplier, stream, others=len(table.categorical), clip=clip)
    encoding = Encoding(table.columns, categories, shares, scaler, (), private=True)
    _check(encoding)
    return encoding, EncodingRelease(multiplier, delta if table.categorical else 0.0, threshold, dropped=dropped)


def refuse_local(table: PartyTable) -> np.ndarray:
    """The refusals that depend on the rows alone, before anything is charged or drawn (a column with no value; a
    block past the memory bound at its widest, every category kept and OTHER): the table's observed cells."""
    observed = refuse_empty(table)
    _check_size(table, {name: (*set(table.text[name]) - {None}, OTHER) for name in table.categorical})
    return observed


def preview(table: PartyTable, multiplier: float, delta: float) -> str:
    """What releasing `table`'s encoding will drop, from its exact counts: for the party's own user (`check`)."""
    from collections import Counter

    var = variance(multiplier, len(table.columns))
    line = f"  under the privacy budget its encoding is released with DP (noise multiplier {multiplier:.3g})"
    if not table.categorical:
        return line + "; two-valued columns stay numeric"
    threshold = category_threshold(var, delta, len(table.categorical))
    counts = {name: Counter(c for c in table.text[name] if c is not None) for name in table.categorical}
    short = sum(sum(n < threshold for n in c.values()) for c in counts.values())
    empty = [name for name, c in counts.items() if max(c.values(), default=0) < threshold]
    return (line + f": a category needs about {threshold:.0f} rows, {short} of {sum(map(len, counts.values()))} "
            f"hold fewer and will mostly read as {OTHER!r}" + (f"; every category of {', '.join(map(repr, empty))} "
                                                               "does: the column will carry next to nothing"
                                                               if empty else ""))


def _categories(table: PartyTable, var: int, delta: float, stream) -> tuple[dict, dict, float, int]:
    """The categories whose noisy counts clear the threshold and OTHER (every column has it, whatever the rows:
    the rest are encoded there), their shares (the first mechanism's kept counts, OTHER's 0, or 1 where none is
    kept: post-processing of the released counts only), the threshold and how many categories missed it."""
    from collections import Counter

    threshold = category_threshold(var, delta, len(table.categorical)) if table.categorical else 0.0
    categories, shares, dropped = {}, {}, 0
    for name in table.categorical:
        counts = Counter(cell for cell in table.text[name] if cell is not None)
        values = sorted(counts)
        released = noisy(np.array([counts[v] for v in values], dtype=np.int64), var, stream)
        kept = {v: c for v, c in zip(values, released, strict=True) if c >= threshold}
        dropped += len(values) - len(kept)
        categories[name] = tuple(sorted({*kept, OTHER}))
        total = sum(kept.values())  # none kept: a missing cell is imputed as OTHER
        shares[name] = tuple(kept.get(v, 0.0) / total if total else float(v == OTHER) for v in categories[name])
    return categories, shares, threshold, dropped


def private_scaler(x: np.ndarray, observed: np.ndarray, multiplier: float, stream, others: int = 0,
                   clip: float = DEFAULT_CLIP) -> Standardizer:
    """The numeric columns' standardisation from the two mechanisms (module docstring); `others`: the
    categorical columns that share the first mechanism's sensitivity (their counts are released with it)."""
    x, d = np.asarray(x, dtype=np.float64), x.shape[1]
    var = variance(multiplier, d + others)
    counts = bin_counts(x, observed)
    present = math.sqrt(var) * float(ndtri(1.0 - FALSE_BINS / counts.size))  # an empty bin: with that chance
    low, high = _ranges(noisy(counts, var, stream), present)
    sums = noisy(moment_sums(x, observed, low, high), variance(multiplier, 3 * d * GRID**2), stream) / GRID
    n = np.maximum(sums[0], 1.0)
    mean = np.clip(sums[1] / n, -1.0, 1.0)
    spread = np.maximum(sums[2] / n - mean**2, (8 * clip) ** -2)  # noise can take it to 0 or below
    mid, half = (low + high) / 2, (high - low) / 2
    return Standardizer(mid + half * mean, half * np.sqrt(spread), clip)


def _ranges(released: np.ndarray, present: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column, the span of the bins whose noisy count clears `present` (the fullest bin where none does),
    within the finite edges."""
    low, high = np.empty(released.shape[0]), np.empty(released.shape[0])
    for j, row in enumerate(released):
        present_bins = np.flatnonzero(row >= present)
        first, last = (present_bins[0], present_bins[-1]) if present_bins.size else (int(np.argmax(row)),) * 2
        low[j] = EDGES[max(first - 1, 0)]
        high[j] = EDGES[min(last, EDGES.size - 1)]
        if high[j] <= low[j]:  # the end bins: one edge each
            low[j], high[j] = (EDGES[0] * 2, EDGES[0]) if first == 0 else (EDGES[-1], EDGES[-1] * 2)
    return low, high
