"""Per-party feature standardisation that stays bounded on features that barely vary in training.

A party standardises its own feature block with statistics of its OWN held training rows:
`z = (x - mean) / scale`, clipped to [-clip, clip], where

    scale = max(std, min_scale_fraction * (max - min))      (training std and range, per feature)

Why a range floor (and not a fraction of the typical std across features): the floor is a
property of each feature alone, so the transform is unchanged when a column is rescaled (metres
vs km, cents vs euros) and one party's column units never shrink another column. It only bites
on features whose training distribution has values more than 1 / min_scale_fraction standard
deviations from the mean: (near-)constant pixels and heavy tails, exactly the features that
blow up test values (a digits pixel that is nearly always 0 in training standardised a test value
to 88 with the plain std). Because every training value lies within `max - min` of the mean,
`|z| <= 1 / min_scale_fraction` on training values; the default floor fraction is therefore
`1 / clip`, so clipping never touches a training value and only bounds test values that lie
outside the range the party saw.

A feature that is constant on the training rows (range within rounding of its magnitude) gets
scale 0 and standardises to 0 everywhere: the model never saw it move, so its first-layer
weights never learned from it and any test deviation could only add noise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DataError

DEFAULT_CLIP = 10.0
_CHUNK = 8192
# A range this close to the column's magnitude is rounding noise, not variation.
_CONSTANT_ULPS = 16 * np.finfo(np.float64).eps


@dataclass(frozen=True, eq=False)
class Standardizer:
    """Fitted per-feature statistics: `mean` and `scale` (float64, read-only, scale 0 = constant
    feature) and the symmetric `clip` bound of the standardised values."""

    mean: np.ndarray
    scale: np.ndarray
    clip: float = DEFAULT_CLIP

    def __post_init__(self) -> None:
        mean = _vector(self.mean, "mean")
        scale = _vector(self.scale, "scale")
        if mean.shape != scale.shape:
            raise DataError(f"standardizer: mean has {mean.size} features but scale has {scale.size}")
        if np.any(scale < 0):
            raise DataError(f"standardizer: scale of feature {int(np.argmax(scale < 0))} is negative")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "clip", _positive(self.clip, "clip"))

    @property
    def n_features(self) -> int:
        return int(self.mean.size)

    @classmethod
    def fit(cls, x: np.ndarray, rows: np.ndarray | None = None, *, min_scale_fraction: float | None = None,
            clip: float = DEFAULT_CLIP) -> Standardizer:
        """Statistics of `x[rows]` (all rows when None; a bool mask or integer indices).

        `min_scale_fraction` (default `1 / clip`) floors each feature's scale at that fraction of
        its training range; `clip` (default 10) bounds the standardised values. A DataError names
        the problem for a non-2-D or non-numeric `x`, bad rows, no rows, or non-finite values.
        """
        clip = _positive(clip, "clip")
        fraction = 1.0 / clip if min_scale_fraction is None else float(min_scale_fraction)
        if not (np.isfinite(fraction) and fraction >= 0):
            raise DataError("standardizer: min_scale_fraction must be a finite number >= 0, "
                            f"got {min_scale_fraction!r}")
        x = _matrix(x, None)
        index = _row_index(rows, x.shape[0])
        lo, hi = _min_max(x, index)
        magnitude = np.maximum(np.abs(lo), np.abs(hi))
        unit = np.where(magnitude > 0, magnitude, 1.0)  # moments of x / unit cannot overflow
        mean_u, std_u = _moments(x, index, unit)
        spread = hi / unit - lo / unit
        scale_u = np.maximum(std_u, fraction * spread)
        scale_u[spread <= _CONSTANT_ULPS] = 0.0
        with np.errstate(over="ignore"):  # an overflow is reported below, naming the feature
            mean, scale = mean_u * unit, scale_u * unit
        if not (np.isfinite(mean).all() and np.isfinite(scale).all()):
            column = int(np.argmax(~(np.isfinite(mean) & np.isfinite(scale))))
            raise DataError(f"standardizer: feature {column} has values too large to standardise")
        return cls(mean, scale, clip)

    def transform(self, x: np.ndarray) -> np.ndarray:
        """float32 `(x - mean) / scale` clipped to [-clip, clip]; constant features map to 0.

        A DataError names the problem when `x` is not a finite 2-D array with `n_features` columns.
        """
        x = _matrix(x, self.n_features)
        varying = self.scale > 0
        safe = np.where(varying, self.scale, 1.0)
        out = np.empty(x.shape, dtype=np.float32)
        with np.errstate(over="ignore"):  # overflow becomes +-inf, which the clip bounds
            for start in range(0, x.shape[0], _CHUNK):
                z = (np.asarray(x[start:start + _CHUNK], dtype=np.float64) - self.mean) / safe
                out[start:start + _CHUNK] = np.clip(np.where(varying, z, 0.0), -self.clip, self.clip)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form: `{"mean": [float], "scale": [float], "clip": float}`."""
        return {"mean": [float(v) for v in self.mean], "scale": [float(v) for v in self.scale],
                "clip": float(self.clip)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Standardizer:
        """The inverse of `to_dict`; a DataError names a missing key, a bad length or a bad value."""
        if not isinstance(d, Mapping):
            raise DataError(f"standardizer: expected a mapping with mean, scale and clip, got {_describe(d)}")
        missing = [key for key in ("mean", "scale", "clip") if key not in d]
        if missing:
            raise DataError(f"standardizer: missing key(s) {', '.join(missing)}")
        return cls(d["mean"], d["scale"], d["clip"])


def _positive(value: Any, name: str) -> float:
    """`value` as a finite float > 0, else a DataError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DataError(f"standardizer: {name} must be a number, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise DataError(f"standardizer: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def _vector(values: Any, name: str) -> np.ndarray:
    """A read-only, non-empty, finite float64 vector, else a DataError naming `name`."""
    if isinstance(values, np.ndarray):
        numeric = values.dtype.kind in "iuf"
    else:  # a JSON list: bools and strings are not numbers even where float() would take them
        numeric = isinstance(values, (list, tuple)) and all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values)
    if not numeric:
        raise DataError(f"standardizer: {name} must be a flat list of numbers, got {_describe(values)}")
    array = np.array(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise DataError(f"standardizer: {name} must be a non-empty flat list, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise DataError(f"standardizer: {name} of feature {int(np.argmax(~np.isfinite(array)))} is not finite")
    array.flags.writeable = False
    return array


def _describe(value: Any) -> str:
    """A short description of a bad value for a message (type and a clipped repr)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _matrix(x: Any, width: int | None) -> np.ndarray:
    """`x` as a 2-D real array (not copied when already one), finite, with `width` columns if given."""
    array = np.asarray(x)
    if array.dtype.kind not in "biuf":
        raise DataError(f"standardizer: features must be numbers, got dtype {array.dtype}")
    if array.ndim != 2:
        raise DataError(f"standardizer: features must be a 2-D (rows, features) array, got shape {array.shape}")
    if width is not None and array.shape[1] != width:
        raise DataError(f"standardizer: fitted on {width} features, got {array.shape[1]}")
    bad = ~np.isfinite(array) if array.dtype.kind == "f" else None
    if bad is not None and bad.any():
        row, column = (int(v) for v in np.argwhere(bad)[0])
        raise DataError(f"standardizer: value at row {row}, feature {column} is not finite ({array[row, column]})")
    return array


def _row_index(rows: Any, n: int) -> np.ndarray:
    """Integer row indices from None (all), a bool mask of length n, or integer indices in [0, n)."""
    if rows is None:
        index = np.arange(n)
    else:
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (n,):
                raise DataError(f"standardizer: row mask has shape {rows.shape}, expected ({n},)")
            index = np.flatnonzero(rows)
        elif rows.dtype.kind in "iu" and rows.ndim == 1:
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                raise DataError(f"standardizer: row indices must lie in 0..{n - 1}")
            index = rows.astype(np.int64)
        else:
            raise DataError(f"standardizer: rows must be a bool mask or 1-D integer indices, got {rows.dtype}")
    if index.size == 0:
        raise DataError("standardizer: no rows to fit on")
    return index


def _blocks(x: np.ndarray, index: np.ndarray) -> Iterator[np.ndarray]:
    """float64 copies of the selected rows, a chunk at a time (bounded memory on 60000 x 784)."""
    for start in range(0, index.size, _CHUNK):
        yield np.asarray(x[index[start:start + _CHUNK]], dtype=np.float64)


def _min_max(x: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = np.full(x.shape[1], np.inf)
    hi = np.full(x.shape[1], -np.inf)
    for block in _blocks(x, index):
        lo = np.minimum(lo, block.min(axis=0))
        hi = np.maximum(hi, block.max(axis=0))
    return lo, hi


def _moments(x: np.ndarray, index: np.ndarray, unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std of x / unit (two passes: no cancellation in the variance)."""
    total = np.zeros(x.shape[1])
    for block in _blocks(x, index):
        total += (block / unit).sum(axis=0)
    mean = total / index.size
    squares = np.zeros(x.shape[1])
    for block in _blocks(x, index):
        squares += np.square(block / unit - mean).sum(axis=0)
    return mean, np.sqrt(squares / index.size)
