"""Gradient-boosted trees on what the active party holds once the generative part is trained (`head =
"network+trees"`): the posterior mean of the latent, which it computes from the posterior sum revealed to
it, its own block and the number of parties holding the record. Trees split on sharp interactions (a
diamond's weight with its grade) that the discriminator, a small network over latent samples, fits only
coarsely (README "Real tables"). Their prediction is blended with the discriminator's by a weight chosen
on the validation records; nothing about either crosses: every input is the active party's own.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..fsio import atomic_write, saved_arrays
from ..metrics import selection_loss, selection_metric

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the trees' share of the blend, chosen on validation records
UNCHOSEN = 0.5  # without validation records
SAVED = "trees.npz"  # the trees' training rows, in the active party's own folder: `predict` refits them
MAX_ITER = 500
MAX_CATEGORIES = 254  # HistGradientBoosting's bins per feature, less the one for a missing value
BAG = 5  # models averaged, each early-stopped on its own tenth: on ames and flights the mean of five scored
# like a single model with a tuned learning rate, without the tuning (README "Real tables")


def head_features(x: Tensor, seen: Tensor, loc: Tensor, n_observed: Tensor,
                  groups: tuple[tuple[int, int], ...] = ()) -> np.ndarray:
    """(B, g + d' + d_h + 1) float64: the active party's block as `coded_block` reads it, the posterior mean, and
    how many parties hold the record."""
    block = coded_block(x.cpu().numpy(), seen.cpu().numpy(), groups)
    return np.hstack([block, loc.cpu().numpy().astype(np.float64), n_observed.cpu().numpy().astype(np.float64)
                      .reshape(-1, 1)])


def coded_block(x: np.ndarray, seen: np.ndarray, groups: tuple[tuple[int, int], ...] = ()) -> np.ndarray:
    """(B, g + d') float64: the code of each categorical column (its one-hot `groups` of cells, [start, stop)), then
    the other cells (NaN in a cell not observed: trees split on missingness)."""
    block = np.where(seen, x, np.nan).astype(np.float64)
    grouped = np.zeros(x.shape[-1], dtype=bool)
    codes = []
    for start, stop in groups:  # a one-hot group read as one category code: trees split sets of categories
        grouped[start:stop] = True
        cells = x[:, start:stop]
        # a code only where the cells are one category (not a missing cell's filled shares, nor all zero)
        known = seen[:, start] & ((cells == 1).sum(axis=-1) == 1) & ((cells == 0).sum(axis=-1) == stop - start - 1)
        codes.append(np.where(known, cells.argmax(axis=-1), np.nan).reshape(-1, 1))
    return np.hstack([*codes, block[:, ~grouped]])


def categorical_mask(groups: tuple[tuple[int, int], ...], width: int) -> np.ndarray:
    """Which of `head_features`' columns scikit-learn reads as categories: the leading codes, up to the
    categories its trees take (MAX_CATEGORIES; a code past it is read as a number)."""
    mask = np.zeros(width, dtype=bool)
    mask[:len(groups)] = [stop - start <= MAX_CATEGORIES for start, stop in groups]
    return mask


class TreesHead:
    """HistGradientBoosting on `head_features` (the mean of BAG models), and its share of the blend with the
    discriminator."""

    def __init__(self, task: str, n_classes: int, seed: int, categorical: np.ndarray | None = None,
                 balanced: bool = False) -> None:
        self.task, self.n_classes, self.seed, self.categorical = task, n_classes, seed, categorical
        self.balanced = balanced and task == "classification"  # class_weight = "balanced": the trees weigh alike
        self.weight, self.scores, self.models = UNCHOSEN, {}, []
        self.features = self.y = None

    def fit(self, features: np.ndarray, y: np.ndarray, each: Callable[[], None] = lambda: None) -> TreesHead:
        """The models on the labeled rows; `each` after every fit (progress peers waiting on this party see)."""
        # scikit-learn is imported here: at module level it costs every command half a second
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        kind = HistGradientBoostingClassifier if self.task == "classification" else HistGradientBoostingRegressor
        stop = _can_stop_early(self.task, y)
        # the seeds differ only in the tenth each model stops on: without early stopping one model is all
        cats = self.categorical if self.categorical is not None and self.categorical.any() else None
        weighted = {"class_weight": "balanced"} if self.balanced else {}
        self.models = [kind(max_iter=MAX_ITER, early_stopping=stop, random_state=self.seed + i,
                            categorical_features=cats, **weighted) for i in range(BAG if stop else 1)]
        with warnings.catch_warnings():  # convergence chatter is not the user's business here
            warnings.simplefilter("ignore")
            for model in self.models:
                model.fit(features, y)
                each()
        self.features, self.y = features, y
        return self

    def predict(self, features: np.ndarray) -> Tensor:
        """Class probabilities (B, C) (a class absent from the trees' rows gets 0), or predicted means (B,)."""
        return torch.from_numpy(np.mean([self._one(model, features) for model in self.models], axis=0))

    def _one(self, model, features: np.ndarray) -> np.ndarray:
        if self.task != "classification":
            return model.predict(features)
        out = np.zeros((features.shape[0], self.n_classes))
        # trees fitted on one class still give two columns, the first that class's (scikit-learn)
        out[:, model.classes_] = model.predict_proba(features)[:, :len(model.classes_)]
        return out

    def blend(self, network: Tensor, features: np.ndarray) -> Tensor:
        """The discriminator's output (probabilities or means) and the trees', weighted by `weight`."""
        trees = self.predict(features).to(network.device)
        return ((1 - self.weight) * network.to(torch.float64) + self.weight * trees).to(network)

    def choose(self, network: Tensor, features: np.ndarray, y: Tensor, class_weights: Tensor | None = None) -> None:
        """The weight of WEIGHTS whose blend scores best on validation records: log loss (class-weighted where
        stage 2 trains so), or RMSE (standardised)."""
        trees, y = self.predict(features).to(network.device), y.to(network.device)
        for w in WEIGHTS:
            blend = (1 - w) * network.to(torch.float64) + w * trees
            self.scores[w] = selection_loss(self.task, blend, y, class_weights)
        self.weight = min(WEIGHTS, key=lambda w: (self.scores[w], abs(w - UNCHOSEN)))

    def record(self) -> dict:
        """What `train_result.json` says of the head."""
        metric = selection_metric(self.task, self.balanced)  # as the epoch's selection
        return {"weight": self.weight, "metric": metric,
                "validation": {str(w): round(s, 6) for w, s in self.scores.items()},
                "rows": int(len(self.y)), "trees": int(sum(m.n_iter_ for m in self.models)),
                "models": len(self.models)}

    def save(self, folder: Path | str) -> None:
        """Its training rows and weight (the active party's own values; owner-only) for `predict` to refit."""
        buffer = io.BytesIO()
        categorical = np.zeros(self.features.shape[1], bool) if self.categorical is None else self.categorical
        np.savez(buffer, features=self.features, y=self.y, weight=np.float64(self.weight), categorical=categorical,
                 balanced=np.bool_(self.balanced))
        atomic_write(Path(folder) / SAVED, buffer.getvalue(), private=True)

    @classmethod
    def load(cls, folder: Path | str, task: str, n_classes: int, seed: int,
             groups: tuple[tuple[int, int], ...]) -> TreesHead:
        """The same trees as in training (a deterministic refit of the saved rows), with the chosen weight."""
        path = Path(folder) / SAVED
        if not path.is_file():
            raise InputError(f"{path} is missing: the model was trained with head = \"network+trees\" and its "
                             "trees are refitted from that file; train again")
        with saved_arrays(path, "trees' rows") as saved:
            features, y, weight = saved["features"], saved["y"], float(saved["weight"])
            if features.ndim != 2 or y.shape != features.shape[:1]:  # (review: an IndexError deeper in)
                raise ValueError(f"rows of shape {features.shape} with labels of shape {y.shape}")
            balanced = bool(saved["balanced"]) if "balanced" in saved.files else False  # (saved before: unweighted)
            if "categorical" in saved.files:
                categorical = saved["categorical"]
            elif not groups:  # saved before the trees read category codes: without categories, the same columns
                categorical = np.zeros(features.shape[1], dtype=bool)
            else:
                categorical = None
        if categorical is None or categorical.shape != (features.shape[1],):
            raise InputError(f"{path} holds trees' rows of another layout than this model's; train again")
        head = cls(task, n_classes, seed, categorical, balanced).fit(features, y)
        head.weight = weight
        return head


def _can_stop_early(task: str, y: np.ndarray) -> bool:
    """Early stopping holds out a tenth of the rows, stratified by class: only where every class present has
    two rows and the tenth has room for each class (else scikit-learn refuses the split)."""
    if task != "classification":
        return len(y) >= 20
    counts = np.unique(y, return_counts=True)[1]
    return bool(counts.min() >= 2 and int(0.1 * len(y)) >= len(counts))
