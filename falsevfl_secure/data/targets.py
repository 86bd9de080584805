"""The active party's regression target on the model's scale, and the quality measures of predictions.

A regression model trains on the target standardised with the mean and (population) standard deviation
of the labeled training rows (`TargetScale`, saved in the active party's manifest) and its predictions
are written back in the original unit. A constant target keeps scale 1 (nothing to divide by).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DataError


@dataclass(frozen=True)
class TargetScale:
    """`standardised = (value - mean) / std`; `std` > 0."""

    mean: float
    std: float

    def __post_init__(self) -> None:
        if not (isinstance(self.mean, float) and isinstance(self.std, float) and math.isfinite(self.mean)
                and math.isfinite(self.std) and self.std > 0):
            raise DataError(f"target scale: mean and std must be finite numbers, std > 0 (got {self.mean!r}, "
                            f"{self.std!r})")

    @classmethod
    def fit(cls, values: np.ndarray) -> TargetScale:
        """The scale of the labeled values (NaN marks an unlabeled row); a DataError when none is labeled."""
        labeled = np.asarray(values, dtype=np.float64)
        labeled = labeled[~np.isnan(labeled)]
        if labeled.size == 0:
            raise DataError("target scale: regression needs at least one labeled row")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, in one line
            mean = float(labeled.mean())
            std = float(np.sqrt(np.mean(np.square(labeled - mean))))
        if not (math.isfinite(mean) and math.isfinite(std)):  # (it fell back to 1: a target of +-1e200 trained as is)
            raise DataError(f"target scale: the labeled values' mean or spread overflows (values from "
                            f"{labeled.min():.3g} to {labeled.max():.3g}); rescale the label column")
        return cls(mean, std if std > 0 else 1.0)

    def transform(self, values: np.ndarray) -> np.ndarray:
        return (np.asarray(values, dtype=np.float64) - self.mean) / self.std

    def inverse(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64) * self.std + self.mean

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "std": self.std}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TargetScale:
        try:
            return cls(float(d["mean"]), float(d["std"]))
        except (KeyError, TypeError, ValueError) as error:
            raise DataError(f"target scale: expected {{'mean': number, 'std': number}}, got {d!r} ({error})") from None


def regression_metrics(predicted: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """RMSE, MAE and R^2 (1 - residual / total sum of squares; NaN when the truth is constant)."""
    predicted, truth = np.asarray(predicted, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    if predicted.shape != truth.shape or predicted.size == 0:
        raise DataError(f"metrics: need equally many predictions and true values, got {predicted.size} and "
                        f"{truth.size}")
    error = predicted - truth
    total = float(np.sum(np.square(truth - truth.mean())))
    r2 = 1.0 - float(np.sum(np.square(error))) / total if total > 0 else math.nan
    return {"rmse": float(np.sqrt(np.mean(np.square(error)))), "mae": float(np.mean(np.abs(error))), "r2": r2}


def accuracy(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Accuracy in percent of equal entries."""
    predicted, truth = np.asarray(predicted), np.asarray(truth)
    if predicted.shape != truth.shape or predicted.size == 0:
        raise DataError(f"metrics: need equally many predictions and true labels, got {predicted.size} and "
                        f"{truth.size}")
    return 100.0 * float(np.mean(predicted == truth))
