"""The active party's own model, fitted at every `train`: what the federation has to beat.

The active party fits scikit-learn models on its own columns and its own labeled training records
(logistic or ridge regression, and histogram gradient boosting), scores them on the same validation
records as the federation, and reports the lift. Nothing crosses: these are values it holds in clear.
A record it lists without holding its block has no feature at all here (every cell missing): the
reference then predicts from nothing, as the active party alone would.
"""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .fsio import atomic_write, saved_arrays
from .metrics import primary, primary_value, task_metrics
from .model.trees import categorical_mask, coded_block
from .randomness import PublicStream, public_rng

MODELS = ("linear", "hgb")
Groups = tuple[tuple[int, int], ...]  # the one-hot cells of each categorical column, [start, stop)


def _features(x: np.ndarray, observed: np.ndarray, held: np.ndarray, kind: str, groups: Groups = ()) -> np.ndarray:
    """hgb: each categorical column's code, then the other cells, NaN in every empty cell (it splits on
    missingness and on sets of categories: as the trees after stage 2 read the block); linear: the block with
    empty cells at the mean (0) plus which cells are observed."""
    seen = observed & held[:, None]
    if kind == "hgb":
        return coded_block(x, seen, groups)
    return np.hstack([np.where(seen, x, 0.0), seen.astype(np.float64)])


def _model(kind: str, task: str, seed: int, categorical: np.ndarray | None = None):
    # scikit-learn's models are imported here: at module level they cost every command half a second
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "hgb":
        cats = categorical if categorical is not None and categorical.any() else None
        return (HistGradientBoostingClassifier(random_state=seed, categorical_features=cats)
                if task == "classification" else HistGradientBoostingRegressor(random_state=seed,
                                                                                categorical_features=cats))
    head = LogisticRegression(max_iter=1000) if task == "classification" else Ridge(alpha=1.0)
    return make_pipeline(StandardScaler(), head)


def _predict(model, features: np.ndarray, task: str, n_classes: int) -> np.ndarray:
    if task != "classification":
        return model.predict(features)
    out = np.zeros((features.shape[0], n_classes))
    out[:, model.classes_] = model.predict_proba(features)  # a class absent from training keeps 0
    return out


def fit_reference(placed, y: np.ndarray, train_rows: np.ndarray, rows: np.ndarray, task: str, n_classes: int,
                  seed: int, groups: Groups = ()) -> dict[str, dict]:
    """Each reference model's predictions on `rows` (positions of the shared order) and its fit time."""
    out = {}
    for kind in MODELS:
        began = time.perf_counter()
        fit_x = _features(placed.x[train_rows], placed.observed[train_rows], placed.held[train_rows], kind, groups)
        model = _fitted(fit_x, y[train_rows], task, seed, kind, groups)
        score_x = _features(placed.x[rows], placed.observed[rows], placed.held[rows], kind, groups)
        out[kind] = {"predictions": _predict(model, score_x, task, n_classes),
                     "fit_s": round(time.perf_counter() - began, 3)}
    return out


def lift_report(task: str, federation: np.ndarray, references: dict[str, dict], truth: np.ndarray,
                inverse=None) -> dict:
    """The federation's metrics, each reference's, and the lift in the primary metric over the best
    reference (positive: the federation is better). `inverse` maps regression outputs to the target's unit."""
    unit = inverse or (lambda v: v)
    conv = (lambda p: p) if task == "classification" else (lambda p: unit(np.asarray(p).reshape(-1)))
    truth = truth if task == "classification" else unit(np.asarray(truth, dtype=np.float64))
    name, larger = primary(task)
    fed = task_metrics(task, conv(federation), truth)
    refs = {k: {**task_metrics(task, conv(r["predictions"]), truth), "fit_s": r["fit_s"]}
            for k, r in references.items()}
    best = (max if larger else min)(refs, key=lambda k: refs[k][name])
    lift = (fed[name] - refs[best][name]) * (1 if larger else -1)
    interval = lift_interval(task, conv(federation), conv(references[best]["predictions"]), truth, larger)
    return {"metric": name, "federation": fed, "active_alone": refs, "best_active_alone": best,
            "lift": round(float(lift), 6), "lift_interval": interval, "records": int(len(truth))}


RESAMPLES = 200  # the lift's bootstrap over the validation records


def lift_interval(task: str, federation: np.ndarray, reference: np.ndarray, truth: np.ndarray,
                  larger: bool) -> list[float]:
    """The lift's 95 % paired bootstrap interval: both models scored on the same resampled records (a public draw;
    nothing here is secret or leaves the active party). A trial's 118 validation records (16 positive) told a lift
    of +0.11 where the held-out records told -0.04: an interval says how little so few records tell."""
    rng, n, sign = public_rng(0, PublicStream.LIFT_BOOTSTRAP), len(truth), 1.0 if larger else -1.0
    lifts = []
    for _ in range(RESAMPLES):
        rows = rng.integers(0, n, n)
        lift = sign * (primary_value(task, federation[rows], truth[rows]) - primary_value(task, reference[rows],
                                                                                           truth[rows]))
        lifts += [lift] if np.isfinite(lift) else []  # (a resample holding one class has no ROC AUC)
    if len(lifts) < RESAMPLES // 2:
        return [float("nan"), float("nan")]
    return [round(float(v), 6) for v in np.percentile(lifts, [2.5, 97.5])]


def _untried(config: dict) -> str:
    """What to try where the federation did not pay, leaving out what the run's settings (`Config.to_dict`)
    already did; under a privacy budget, what the budget allows (a trial was told to schedule 920 releases a row
    and to run a baseline the budget refuses)."""
    if (config.get("privacy") or {}).get("epsilon", 0) > 0:
        return ("Under a privacy budget the noise on the summed rounds can leave the other parties' columns little to "
                "add (README, \"Output privacy\"): fewer releases per row (fewer stage-1 epochs, stage2_pass = "
                "\"once\") or a larger epsilon leave less noise; `federation check` says what a schedule spends")
    options = config.get("options", {})
    tries = [("preset = \"auto\" with auto_schedule = true (more steps)", config.get("auto_schedule")),
             ("discriminator_inputs = \"latent+mean+own\"", options.get("discriminator_inputs") == "latent+mean+own"),
             ("class_weight = \"balanced\" for rare classes",
              config.get("class_weight") == "balanced" or config.get("task") == "regression"),
             ("numeric_encoding = \"quantile\" (every numeric column at its normal score, not only the crowded "
              "ones: README, \"Real tables\")", config.get("numeric_encoding") == "quantile")]
    text = "Try " + ", ".join(t for t, done in tries if not done) + ", and c" if any(not d for _, d in tries) else "C"
    return text + ("heck with `federation check` that the parties' IDs line up; method = \"plugvfl\" often fits "
                   "tables better, but sends every party label-dependent gradients (threat_models/labels.toml)")


def lift_lines(report: dict, config: dict | None = None) -> list[str]:
    """The lines `train` prints: the comparison, then a `warning:` line where the federation did not pay, with
    what to try that the run's settings (`config`, as `Config.to_dict` writes them) did not."""
    name, best = report["metric"], report["best_active_alone"]
    fed, ref = report["federation"][name], report["active_alone"][best][name]
    label = {"linear": "linear model", "hgb": "gradient-boosted trees"}[best]
    low, high = report.get("lift_interval", [float("nan")] * 2)  # (reports written before it have none)
    lines = [f"lift: federation {name} {fed:.4f} against the active party alone {ref:.4f} ({label} on its own "
             f"columns), {report['lift']:+.4f} on {report['records']} validation records"
             + (f" (95 % interval {low:+.4f} to {high:+.4f})" if np.isfinite(low) else "")]
    perfect = ref == (1.0 if name == "roc_auc" else 0.0)  # nothing left to beat
    if not report["lift"] > 0 and not perfect:
        lines.append(f"warning: the federation does not beat the active party's own {label} ({name} {fed:.4f} "
                     f"against {ref:.4f}): the other parties' columns did not pay on this run. "
                     f"{_untried(config or {})}")
    elif not perfect and "lift_interval" in report and not low > 0:  # (nan: too few of a class to resample)
        lines.append(f"warning: {report['records']} validation records are too few to tell whether the federation "
                     "pays: the lift's 95 % interval reaches 0 or below, and these records also chose the epoch "
                     "(and the blend with the trees), which favours the federation; score held-out records "
                     "(`federation score`), or hold out more (validation_fraction)")
    if "predicted_classes" in report["federation"] and report["federation"]["predicted_classes"] == 1:
        lines.append("warning: the federation predicts one class for every validation record (accuracy "
                     f"{100 * report['federation']['accuracy']:.1f} %, balanced accuracy "
                     f"{report['federation']['balanced_accuracy']:.3f}): use the class probabilities (ROC AUC "
                     "reads them) or set class_weight = \"balanced\" in [model]")
    else:
        lines += _class_lines(report["federation"], report.get("classes"), (config or {}).get("class_weight"))
    return lines


MISSED = 5  # validation records of a class, at least, for its never being predicted to be named


def _class_lines(fed: dict, classes: list[str] | None, weighting: str | None) -> list[str]:
    """A warning for each class of MISSED validation records or more that no record was predicted as (a trial's
    7 classes: the rarest got 1 prediction in 3,860); a note where class_weight = "balanced" took the accuracy below
    the most common class's share (it did: 34 % against 36 %, and nothing said so)."""
    if "hits" not in fed:
        return []
    names = classes or [str(c) for c in range(len(fed["support"]))]
    missed = [f"{names[c]!r} ({n})" for c, n in enumerate(fed["support"]) if n >= MISSED and fed["hits"][c] == 0]
    advice = ("class_weight = \"balanced\" is set; more records of it, or columns that tell it apart, may help"
              if weighting == "balanced" else "class_weight = \"balanced\" in [model] weighs rare classes up (it "
              "trades accuracy for balanced accuracy)")
    lines = [f"warning: no validation record of class {', '.join(missed)} was predicted as it (its validation "
             f"records in parentheses): {advice}"] if missed else []
    if weighting == "balanced" and fed["accuracy"] < fed["majority"]:
        lines.append(f"note: with class_weight = \"balanced\" the accuracy ({100 * fed['accuracy']:.1f} %) is below "
                     f"the most common class's share ({100 * fed['majority']:.1f} %): it bought balanced accuracy "
                     f"({100 * fed['balanced_accuracy']:.1f} %); leave it out where accuracy is what counts")
    return lines


# -- the active party's own models' scores as inputs of its discriminator (`own_reference`) ---------------

FOLDS = 5
SAVED = "own_reference.npz"  # the active party's own labeled rows, kept to refit its models at `predict`


def _score_columns(model, features: np.ndarray, task: str, n_classes: int) -> np.ndarray:
    """A model's output as discriminator inputs: log-probabilities (classification; the logit for two
    classes), or the standardised prediction (regression)."""
    if task != "classification":
        return model.predict(features).reshape(-1, 1)
    logp = np.log(np.clip(_predict(model, features, task, n_classes), 1e-6, 1.0))
    return logp[:, 1:] - logp[:, :1] if n_classes == 2 else logp


def _out_of_fold(features: np.ndarray, y: np.ndarray, task: str, n_classes: int, seed: int, kind: str,
                 groups: Groups = (), each: Callable[[], None] = lambda: None) -> np.ndarray:
    """Each labeled row's score from a `kind` model that never saw it (K folds in row order, public); `each` after
    every fold (the party's progress, so peers waiting on it see it work)."""
    out = np.zeros((len(y), 1 if task != "classification" or n_classes == 2 else n_classes))
    folds = np.array_split(np.arange(len(y)), min(FOLDS, max(len(y), 1)))
    for fold in folds:
        rest = np.setdiff1d(np.arange(len(y)), fold)
        if fold.size and rest.size:
            model = _fitted(features[rest], y[rest], task, seed, kind, groups)
            out[fold] = _score_columns(model, features[fold], task, n_classes)
        each()
    return out


def _fitted(features: np.ndarray, y: np.ndarray, task: str, seed: int, kind: str = "hgb", groups: Groups = ()):
    """`kind`'s model fitted on `_features`' columns (the hgb's leading codes of `groups` read as categories)."""
    model = _model(kind, task, seed, categorical_mask(groups, features.shape[1]) if kind == "hgb" else None)
    with warnings.catch_warnings():  # convergence chatter is not the user's business here
        warnings.simplefilter("ignore")
        model.fit(features, y)
    return model


def own_scores(placed, y: np.ndarray, labeled: np.ndarray, task: str, n_classes: int, seed: int,
               others: tuple = (), each: Callable[[], None] = lambda: None, kinds: tuple[str, ...] = ("hgb",),
               groups: Groups = ()) -> np.ndarray | tuple[np.ndarray, list[np.ndarray]]:
    """(n, e) float32: the active party's own models' scores of every record of the shared order (`kinds` of
    MODELS, their columns side by side), out of fold on its labeled training rows (so stage 2 never reads a
    score fitted to the row's own label). With `others` (blocks placed alike: a simulation's test splits),
    also each one's scores by the full fits. `each` after every fit; `groups`: the block's categorical columns."""
    parts = [_own_kind(kind, placed, y, labeled, task, n_classes, seed, others, each, groups) for kind in kinds]
    out = np.hstack([train for train, _ in parts]).astype(np.float32)
    if not others:
        return out
    return out, [np.hstack([scored[i] for _, scored in parts]).astype(np.float32) for i in range(len(others))]


def _own_kind(kind: str, placed, y: np.ndarray, labeled: np.ndarray, task: str, n_classes: int, seed: int,
              others: tuple, each: Callable[[], None], groups: Groups) -> tuple[np.ndarray, list[np.ndarray]]:
    """One model's scores: of the shared order (out of fold on the labeled rows) and of each of `others`."""
    features = _features(placed.x, placed.observed, placed.held, kind, groups)
    full = _fitted(features[labeled], y[labeled], task, seed, kind, groups)
    each()
    out = _score_columns(full, features, task, n_classes)
    out[labeled] = _out_of_fold(features[labeled], y[labeled], task, n_classes, seed, kind, groups, each)
    return out, [_score_columns(full, _features(o.x, o.observed, o.held, kind, groups), task, n_classes)
                 for o in others]


def save_own_rows(model_dir, placed, y: np.ndarray, labeled: np.ndarray, groups: Groups = ()) -> None:
    """Keep the labeled rows the own models were fitted on, and the categorical columns they read as codes (the
    active party's own values, in its own folder)."""
    buffer = io.BytesIO()
    np.savez(buffer, x=placed.x[labeled], observed=placed.observed[labeled], held=placed.held[labeled],
             y=y[labeled], groups=np.asarray(groups, dtype=np.int64).reshape(-1, 2))
    atomic_write(Path(model_dir) / SAVED, buffer.getvalue(), private=True)


def refit_scores(model_dir, placed, task: str, n_classes: int, seed: int, kinds: tuple[str, ...] = ("hgb",)
                 ) -> np.ndarray:
    """At `predict`: the models refitted on the saved rows (the same fits as in training), scoring `placed`."""
    with saved_arrays(Path(model_dir) / SAVED, "active party's own rows") as saved:
        rows = {key: saved[key] for key in ("x", "observed", "held", "y")}
        if rows["x"].ndim != 2 or rows["observed"].shape != rows["x"].shape or \
                {rows["held"].shape, rows["y"].shape} != {rows["x"].shape[:1]}:  # (review: a numpy error deeper in)
            raise ValueError(f"rows of shape {rows['x'].shape} with others of {[rows[k].shape for k in rows]}")
        # (saved before the codes: its fits read every cell as a number, and so do these)
        groups = _saved_groups(saved["groups"], rows["x"].shape[1]) if "groups" in saved.files else ()
    columns = []
    for kind in kinds:
        full = _fitted(_features(rows["x"], rows["observed"], rows["held"], kind, groups), rows["y"], task, seed,
                       kind, groups)
        scored = _features(placed.x, placed.observed, placed.held, kind, groups)
        columns.append(_score_columns(full, scored, task, n_classes))
    return np.hstack(columns).astype(np.float32)


def _saved_groups(saved: np.ndarray, width: int) -> Groups:
    """The saved groups, checked: ordered, disjoint cells of the block (a numpy error deeper in otherwise)."""
    ends = saved.reshape(-1).tolist() if saved.ndim == 2 and saved.shape[1] == 2 else None
    if ends is None or ends != sorted(ends) or any(a >= b for a, b in zip(ends[::2], ends[1::2], strict=True)) \
            or (ends and (ends[0] < 0 or ends[-1] > width)):
        raise ValueError(f"categorical groups {saved.tolist()} for a block of {width} cells")
    return tuple(zip(ends[::2], ends[1::2], strict=True))
