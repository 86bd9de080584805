"""The metrics a tabular user reads: for classification ROC AUC (one-vs-rest macro for several classes),
PR AUC (average precision), balanced accuracy, accuracy, log loss and the expected calibration error; for
regression RMSE, MAE and R^2. `primary` is the one the lift is reported in (ROC AUC, or RMSE)."""

from __future__ import annotations

import math
import warnings

import numpy as np

from .data.targets import regression_metrics

ECE_BINS = 15


def expected_calibration_error(probabilities: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> float:
    """sum_b |B_b| / n * |accuracy(B_b) - confidence(B_b)| over equal-width bins of the top probability."""
    confidence, predicted = probabilities.max(axis=1), probabilities.argmax(axis=1)
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    total = 0.0
    for b in np.unique(which):
        rows = which == b
        total += rows.mean() * abs(float(np.mean(predicted[rows] == y[rows])) - float(confidence[rows].mean()))
    return total


def _ranking(probabilities: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """ROC AUC and PR AUC; NaN where the records hold a single class."""
    from sklearn import metrics as skm  # here: scikit-learn costs every command a second at start-up

    present = np.unique(y)
    if present.size < 2:
        return {"roc_auc": math.nan, "pr_auc": math.nan}
    if probabilities.shape[1] == 2:
        return {"roc_auc": float(skm.roc_auc_score(y, probabilities[:, 1])),
                "pr_auc": float(skm.average_precision_score(y, probabilities[:, 1]))}
    onehot = np.eye(probabilities.shape[1])[y][:, present]
    scores = probabilities[:, present]
    return {"roc_auc": float(skm.roc_auc_score(onehot, scores, average="macro")),
            "pr_auc": float(skm.average_precision_score(onehot, scores, average="macro"))}


def classification_metrics(probabilities: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Every classification metric of class probabilities (n, C) against labels (n,) in 0..C-1."""
    given = np.asarray(probabilities, dtype=np.float64)
    probabilities = np.clip(given, 1e-12, 1.0)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    y = np.asarray(y, dtype=np.int64)
    predicted = probabilities.argmax(axis=1)
    from sklearn.metrics import balanced_accuracy_score

    with warnings.catch_warnings():  # "y_pred contains classes not in y_true": the mean recall is still defined
        warnings.simplefilter("ignore")
        balanced = float(balanced_accuracy_score(y, predicted)) if y.size else math.nan
    return {**_ranking(given, y),  # as given: dividing rows that sum to 1 within rounding broke ties (0.854 for 0.868)
            "balanced_accuracy": balanced,
            "accuracy": float(np.mean(predicted == y)),
            "log_loss": float(-np.mean(np.log(probabilities[np.arange(y.size), y]))),
            "ece": expected_calibration_error(probabilities, y),
            "predicted_classes": int(np.unique(predicted).size),
            "majority": float(np.bincount(y).max() / y.size) if y.size else math.nan,
            # per class (0..C-1): its records, and how many of them were predicted as it (a trial's rare class got
            # one prediction in 3,860, and nothing said so)
            "support": np.bincount(y, minlength=probabilities.shape[1]).tolist(),
            "hits": np.bincount(y[predicted == y], minlength=probabilities.shape[1]).tolist()}


def primary(task: str) -> tuple[str, bool]:
    """(the metric the lift is reported in, whether larger is better)."""
    return ("roc_auc", True) if task == "classification" else ("rmse", False)


def primary_value(task: str, predictions: np.ndarray, truth: np.ndarray) -> float:
    """The primary metric alone (`primary`): ROC AUC of class probabilities, or RMSE in the target's unit."""
    if task == "classification":
        return _ranking(np.asarray(predictions, dtype=np.float64), np.asarray(truth, dtype=np.int64))["roc_auc"]
    error = np.asarray(predictions, dtype=np.float64).reshape(-1) - np.asarray(truth, dtype=np.float64).reshape(-1)
    return float(np.sqrt(np.mean(error * error)))


def task_metrics(task: str, predictions: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """`classification_metrics` or `regression_metrics` (predictions and truth in the target's unit)."""
    if task == "classification":
        return classification_metrics(predictions, truth)
    return regression_metrics(np.asarray(predictions).reshape(-1), np.asarray(truth).reshape(-1))


def selection_metric(task: str, balanced: bool = False) -> str:
    """The name `train_result.json` gives `selection_loss`."""
    if task != "classification":
        return "rmse_standardised"
    return "log_loss_balanced" if balanced else "log_loss"


def selection_loss(task: str, out, y, class_weights=None) -> float:
    """What validation records choose by (stage 2's best epoch, the trees' share): the log loss of class
    probabilities (B, C), or the RMSE of predicted means (B,) in the target's standardised unit (tensors). With
    `class_weights` (C,) (`class_weight = "balanced"`) each record's log loss is weighted by its class's, as stage 2
    trains (a trial: the unweighted loss chose the blend that undid the weighting)."""
    if task == "classification":
        losses = -out.clamp(min=1e-12).log().gather(-1, y.long().view(-1, 1)).view(-1)
        if class_weights is None:
            return float(losses.mean())
        weights = class_weights.to(losses)[y.long()]
        return float((weights * losses).sum() / weights.sum().clamp(min=1e-12))
    return float((out - y.to(out.dtype)).pow(2).mean().sqrt())
