"""A party's feature block as the model sees it, learned from the party's own training table only.

Numeric columns are standardised (`Standardizer`) with the statistics of their OBSERVED training cells,
except binary ones (exactly two values in training), written 0 (the smaller value) and 1 (the larger);
with `numeric = "quantile"` a numeric column (not a binary one) is first mapped to its normal score, the
standard normal quantile of its rank among the party's own training values (`normal_scores`: what separates 0 ft from
35 ft in a column whose spread is thousands of feet, where the decoder's floor of 0.2 std could not); categorical
columns are one-hot encoded, one cell per category seen in the training table (sorted),
named `column=category`. A missing cell is imputed with its column's training mean (0 for a
standardised numeric cell, the category's training share for each one-hot cell of a missing category)
and marked unobserved in the per-cell `observed` mask; a missing categorical cell is unobserved in all
its one-hot cells. A category the training table never held (at prediction) gives all-zero one-hot
cells, unobserved, and is counted; under a budget the encoding is released with DP instead
(data/private_encoding.py) and every categorical column has an OTHER cell, which takes every value the release
did not keep, observed. A row whose every encoded cell is unobserved is not held.

The encoding (categories, their shares, the standardisation) is saved in the party's manifest and never
leaves the party.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import DataError
from .standardize import DEFAULT_CLIP, Standardizer
from .tables import PartyTable

_UNSEEN_SHOWN = 5  # unseen values kept per column for the report
OTHER = "(other)"  # a private encoding's cell of every category it did not release (data/private_encoding.py)


@dataclass(frozen=True, eq=False)
class Encoding:
    """What turns a party's table into its block: the raw columns in the model's order, the categories
    (and their training shares) of each categorical column, the standardisation of the numeric ones."""

    columns: tuple[str, ...]
    categories: Mapping[str, tuple[str, ...]]
    shares: Mapping[str, tuple[float, ...]]
    scaler: Standardizer | None  # the numeric columns, in column order; None when there is none
    binary: tuple[str, ...] = ()  # numeric columns with two values in training: encoded 0/1 (by the scaler)
    private: bool = False  # released with DP: each categorical column's OTHER cell takes every unreleased value
    quantiles: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # numeric = "quantile": `reference_values`

    @property
    def numeric(self) -> tuple[str, ...]:
        return tuple(name for name in self.columns if name not in self.categories)

    @property
    def names(self) -> tuple[str, ...]:
        """The encoded columns: a numeric column keeps its name, a category cell is `column=category`."""
        out: list[str] = []
        for name in self.columns:
            out += [f"{name}={c}" for c in self.categories[name]] if name in self.categories else [name]
        return tuple(out)

    @property
    def width(self) -> int:
        return len(self.names)

    def kinds(self) -> list[tuple[str, int, int]]:
        """(kind, first encoded cell, end) of each raw column: numeric, binary or categorical (the
        likelihood each column gets: model/likelihood.py)."""
        return [("categorical" if name in self.categories else "binary" if name in self.binary else "numeric",
                 start, stop) for name, start, stop in self.spans()]

    def spans(self) -> list[tuple[str, int, int]]:
        """(column, first encoded cell, end) of each raw column, in order."""
        out, start = [], 0
        for name in self.columns:
            width = len(self.categories[name]) if name in self.categories else 1
            out.append((name, start, start + width))
            start += width
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (see `from_dict`)."""
        return {"columns": list(self.columns),
                "categories": {name: list(values) for name, values in self.categories.items()},
                "shares": {name: [float(v) for v in values] for name, values in self.shares.items()},
                "standardizer": None if self.scaler is None else self.scaler.to_dict(),
                "binary": list(self.binary), "private": self.private,
                "quantiles": {name: [float(v) for v in values] for name, values in self.quantiles.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Encoding:
        """The inverse of `to_dict`; a DataError names what is malformed."""
        try:
            columns = tuple(str(c) for c in d["columns"])
            categories = {str(k): tuple(str(v) for v in values) for k, values in d["categories"].items()}
            shares = {str(k): tuple(float(v) for v in values) for k, values in d["shares"].items()}
            scaler = None if d["standardizer"] is None else Standardizer.from_dict(d["standardizer"])
            binary = tuple(str(c) for c in d.get("binary", ()))  # older manifests: none
            private = d.get("private", False)
            if not isinstance(private, bool):
                raise TypeError(f"private must be true or false, not {private!r}")
            quantiles = {str(k): tuple(float(v) for v in values) for k, values in d.get("quantiles", {}).items()}
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise DataError(f"encoding: not a saved encoding ({type(error).__name__}: {error})") from None
        encoding = cls(columns, categories, shares, scaler, binary, private, quantiles)
        _check(encoding)
        return encoding


def _check(encoding: Encoding) -> None:
    """The parts of an encoding must agree (a hand-edited or foreign manifest is refused)."""
    if len(set(encoding.columns)) != len(encoding.columns) or set(encoding.categories) - set(encoding.columns):
        raise DataError("encoding: the columns must be distinct and include every categorical column")
    for name, values in encoding.categories.items():
        shares = encoding.shares.get(name, ())
        if not values or len(shares) != len(values) or len(set(values)) != len(values):
            raise DataError(f"encoding: column {name!r} needs distinct categories, at least one, and one share each")
        if not all(0.0 <= share <= 1.0 for share in shares):  # (NaN fails too)
            raise DataError(f"encoding: column {name!r}: a category's share must lie in [0, 1]")
    if set(encoding.binary) - set(encoding.numeric):
        raise DataError("encoding: a binary column must be one of the numeric columns")
    if encoding.private and any(OTHER not in values for values in encoding.categories.values()):
        raise DataError(f"encoding: a private encoding's categorical columns each need the {OTHER!r} cell")
    for name, values in encoding.quantiles.items():
        if name not in encoding.numeric or name in encoding.binary or len(values) < 2 or \
                not (np.isfinite(values).all() and (np.diff(values) >= 0).all()):
            raise DataError(f"encoding: column {name!r}: normal scores need a numeric, non-binary column and at least "
                            "two finite, non-decreasing reference values")
    numeric = len(encoding.numeric)
    if (encoding.scaler.n_features if encoding.scaler is not None else 0) != numeric:
        raise DataError(f"encoding: the standardisation must cover the {numeric} numeric columns")


MAX_CELLS = 1 << 28  # encoded cells of a block (rows x one-hot width): 1.25 GiB with the observed mask


def _check_size(table: PartyTable, categories: Mapping[str, tuple[str, ...]]) -> None:
    """Refuse a block whose one-hot cells would not fit memory, naming its widest categorical columns (a column
    with a value per row, 20,000 rows, took 4.2 GB; 100,000 asked for 37 GiB and failed inside numpy)."""
    width = len(table.columns) - len(categories) + sum(len(c) for c in categories.values())
    if table.n_rows * width <= MAX_CELLS:
        return
    widest = sorted(categories, key=lambda c: -len(categories[c]))[:3]
    raise DataError(f"{table.where}: {table.n_rows} rows x {width} encoded cells is more than {MAX_CELLS:,} cells; "
                    f"the widest categorical columns: " + ", ".join(f"{c!r} ({len(categories[c])} categories)"
                                                               for c in widest)
                    + "; remove a column that identifies records, or group its rare categories")


# How a numeric column reaches its standardisation (`fit_encoding`); "auto" (the tables' preset): the normal scores
# of a crowded column only (`crowded`), and under a privacy budget the private release's standardisation
NUMERIC = ("auto", "standard", "quantile")
CROWDED = 0.5  # "auto": a column whose middle half spans less than this many standard deviations is crowded
QUANTILES = 1000  # reference values of a column's normal scores (scikit-learn's QuantileTransformer's default)
RANK_BOUND = 1e-7  # ranks clipped to [RANK_BOUND, 1 - RANK_BOUND]: normal scores within +-5.2 (as scikit-learn)


def reference_values(values: np.ndarray) -> tuple[float, ...]:
    """A column's observed training values at QUANTILES evenly spaced ranks (at least two)."""
    return tuple(np.quantile(values, np.linspace(0.0, 1.0, max(2, min(QUANTILES, values.size)))).tolist())


def normal_scores(x: np.ndarray, reference: tuple[float, ...]) -> np.ndarray:
    """Each value's normal score: the standard normal quantile of its rank among the reference values (linear
    between them; a value tied with several takes the middle of their ranks), the lowest score at or below the
    smallest (a spike of 0 ft among heights far from the rest) and the highest at or above the largest, as
    scikit-learn's QuantileTransformer."""
    from scipy.special import ndtri  # (scipy comes with scikit-learn; at module level it costs every command)

    ref = np.asarray(reference, dtype=np.float64)
    levels = np.linspace(0.0, 1.0, ref.size)
    rank = 0.5 * (np.interp(x, ref, levels) - np.interp(-x, -ref[::-1], -levels[::-1]))
    rank = np.where(x <= ref[0], 0.0, np.where(x >= ref[-1], 1.0, rank))
    return ndtri(np.clip(rank, RANK_BOUND, 1 - RANK_BOUND))


def crowded(values: np.ndarray) -> bool:
    """Whether a heavy tail squeezes a column's bulk: its middle half spans less than CROWDED standard deviations (a
    normal column's spans 1.35; a trial's heights, 41 % at 0 ft and the rest up to 32,500 ft, 0.27), so that its
    common values lie within the decoder's std floor of each other once standardised."""
    values = np.asarray(values, dtype=np.float64)
    low, high = np.percentile(values, [25, 75])
    return bool(values.std() > 0 and high - low < CROWDED * values.std())


def _scored(x: np.ndarray, observed: np.ndarray, names: tuple[str, ...],
            quantiles: Mapping[str, tuple[float, ...]]) -> np.ndarray:
    """The numeric block `x` (columns `names`) with each column of `quantiles` at its normal scores where observed."""
    if not quantiles:
        return x
    out = np.array(x, dtype=np.float64)
    for j, name in enumerate(names):
        if name in quantiles:
            out[observed[:, j], j] = normal_scores(out[observed[:, j], j], quantiles[name])
    return out


def fit_encoding(table: PartyTable, clip: float = DEFAULT_CLIP, numeric: str = "standard") -> Encoding:
    """The encoding learned from a training table (`numeric`: one of NUMERIC); a DataError names a column with no
    value at all."""
    observed = refuse_empty(table)
    categories, shares = {}, {}
    for name in table.categorical:
        counts = Counter(cell for cell in table.text[name] if cell is not None)
        categories[name] = tuple(sorted(counts))
        total = sum(counts.values())
        shares[name] = tuple(counts[c] / total for c in categories[name])
    _check_size(table, categories)
    numbers = [j for j, name in enumerate(table.columns) if name not in table.text]
    x, seen, names = table.x[:, numbers], observed[:, numbers], tuple(table.columns[j] for j in numbers)
    binary = _two_valued(x, seen)
    quantiles = {name: reference_values(x[seen[:, j], j]) for j, name in enumerate(names)
                 if not binary[j] and (numeric == "quantile" or numeric == "auto" and crowded(x[seen[:, j], j]))}
    scaler = _fit_numeric(_scored(x, seen, names, quantiles), seen, clip) if numbers else None
    if binary.any():  # mean = the smaller value, scale = the gap: the scaler writes them 0 and 1
        low, high = _low_high(x, seen, binary)
        mean, scale = scaler.mean.copy(), scaler.scale.copy()
        mean[binary], scale[binary] = low, high - low
        scaler = Standardizer(mean, scale, clip)
    two = tuple(name for name, pair in zip(names, binary, strict=True) if pair)
    return Encoding(table.columns, categories, shares, scaler, two, quantiles=quantiles)


def refuse_empty(table: PartyTable) -> np.ndarray:
    """The table's observed cells; a DataError names a column with no value at all."""
    observed = table.observed
    empty = np.flatnonzero(~observed.any(axis=0))
    if empty.size:
        raise DataError(f"{table.where}, column {table.columns[empty[0]]!r}: no cell of the column holds a "
                        "value; remove the column or fill some of its cells")
    return observed


def _two_valued(x: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Per column: exactly two distinct values among its observed cells."""
    return np.array([np.unique(x[observed[:, j], j]).size == 2 for j in range(x.shape[1])], dtype=bool)


def _low_high(x: np.ndarray, observed: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = [np.unique(x[observed[:, j], j]) for j in np.flatnonzero(columns)]
    return np.array([v[0] for v in values]), np.array([v[1] for v in values])


def _fit_numeric(x: np.ndarray, observed: np.ndarray, clip: float) -> Standardizer:
    """One standardisation over the numeric columns, each fitted on its observed cells (the columns
    observed wherever the block is held are fitted together, in one pass)."""
    held = observed.any(axis=1)
    full = observed[held].all(axis=0)
    mean, scale = np.zeros(x.shape[1]), np.zeros(x.shape[1])
    if full.any():
        joint = Standardizer.fit(x[held][:, full], clip=clip)
        mean[full], scale[full] = joint.mean, joint.scale
    for j in np.flatnonzero(~full):
        alone = Standardizer.fit(x[observed[:, j]][:, [j]], clip=clip)
        mean[j], scale[j] = alone.mean[0], alone.scale[0]
    return Standardizer(mean, scale, clip)


@dataclass(frozen=True, eq=False)
class EncodedBlock:
    """A table's block under an encoding: `x` float32 (n_rows, width) finite, `observed` bool (n_rows,
    width), `held` bool (n_rows,) (some cell observed), and per categorical column with categories the
    encoding never saw: (cells, some of the values)."""

    x: np.ndarray
    observed: np.ndarray
    held: np.ndarray
    unseen: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def unseen_cells(self) -> int:
        return sum(count for count, _ in self.unseen.values())


def encode(table: PartyTable, encoding: Encoding) -> EncodedBlock:
    """`table`'s block under `encoding` (columns matched by name); a DataError names a column the table
    lacks or a column whose kind differs from training."""
    x = np.zeros((table.n_rows, encoding.width), dtype=np.float32)
    observed = np.zeros((table.n_rows, encoding.width), dtype=bool)
    unseen = {}
    numeric_at = []
    for name, start, stop in encoding.spans():
        if name not in table.columns:
            raise DataError(f"{table.where}: no column {name!r}, which the encoding needs")
        if (name in encoding.categories) != (name in table.text):
            kind = "categorical" if name in encoding.categories else "numeric"
            raise DataError(f"{table.where}, column {name!r}: the column was {kind} in training")
        if name in encoding.categories:
            count = _one_hot(table.text[name], encoding, name, x[:, start:stop], observed[:, start:stop])
            if count[0]:
                unseen[name] = count
        else:
            numeric_at.append(start)
    if numeric_at:
        _standardised(table, encoding, x, observed, numeric_at)
    return EncodedBlock(_frozen(x), _frozen(observed), _frozen(observed.any(axis=1)), unseen)


def _one_hot(cells: tuple[str | None, ...], encoding: Encoding, name: str, x: np.ndarray,
             observed: np.ndarray) -> tuple[int, tuple[str, ...]]:
    """Write one column's one-hot cells into the views `x` and `observed`; (unseen cells, some values)."""
    index = {category: i for i, category in enumerate(encoding.categories[name])}
    codes = np.array([-2 if cell is None else index.get(cell, -1) for cell in cells], dtype=np.int64)
    strange = [cells[i] for i in np.flatnonzero(codes == -1)]
    if encoding.private:  # a value it did not release (rare in training, or new) is observed in the OTHER cell
        codes[codes == -1] = index[OTHER]
    known = np.flatnonzero(codes >= 0)
    x[known, codes[known]] = 1.0
    observed[known] = True
    x[codes == -2] = np.asarray(encoding.shares[name], dtype=np.float32)
    return len(strange), tuple(dict.fromkeys(strange))[:_UNSEEN_SHOWN]


def _standardised(table: PartyTable, encoding: Encoding, x: np.ndarray, observed: np.ndarray,
                  positions: list[int]) -> None:
    """Write the standardised numeric cells (missing cells at the training mean, i.e. 0) into `x`."""
    raw = table.x[:, [table.columns.index(name) for name in encoding.numeric]].astype(np.float64)
    present = ~np.isnan(raw)
    raw = _scored(raw, present, encoding.numeric, encoding.quantiles)
    filled = np.where(present, raw, encoding.scaler.mean)
    x[:, positions] = encoding.scaler.transform(filled)
    observed[:, positions] = present


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
