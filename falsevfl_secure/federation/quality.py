"""How good the joint model is: the metric on the held-out validation records at the end of training,
overall and per number of parties observed (accuracy in % for classification, RMSE in the target's unit
for regression, with MAE and R^2), and the `score` of a predictions file against the truth."""

from __future__ import annotations

import numpy as np

from ..data.targets import TargetScale, accuracy, regression_metrics


def validation_table(predictions: np.ndarray, targets: np.ndarray, n_observed: np.ndarray, task: str,
                     scale: TargetScale | None) -> dict:
    """The metric of the validation records: `predictions` as the model gives them (probabilities, or
    standardised values), `targets` the model's targets, `n_observed` the parties holding each record."""
    if task == "classification":
        predicted, truth = np.asarray(predictions).argmax(-1), np.asarray(targets)
    else:
        scale = scale or TargetScale(0.0, 1.0)
        predicted, truth = scale.inverse(np.asarray(predictions).reshape(-1)), scale.inverse(targets)
    table = {"metric": "accuracy" if task == "classification" else "rmse", "records": int(truth.size),
             **_metric(predicted, truth, task, full=True), "by_parties_observed": {}}
    if task == "classification":  # accuracy alone reads an imbalanced label badly (a trial: 81.9 %, one class 81.5 %)
        table.update(_ranked(np.asarray(predictions), truth))
    for count in np.unique(n_observed):
        rows = np.asarray(n_observed) == count
        table["by_parties_observed"][str(int(count))] = {"records": int(rows.sum()),
                                                         "value": _metric(predicted[rows], truth[rows], task)["value"]}
    return table


def _ranked(probabilities: np.ndarray, truth: np.ndarray) -> dict:
    """ROC AUC, balanced accuracy (%) and the most common class's share (%) of the validation records."""
    from ..metrics import classification_metrics

    found, counts = classification_metrics(probabilities, truth), np.bincount(truth.astype(np.int64))
    return {"roc_auc": round(found["roc_auc"], 4), "balanced_accuracy": round(100 * found["balanced_accuracy"], 2),
            "majority": round(100 * counts.max() / max(truth.size, 1), 2), "n_classes": int(probabilities.shape[-1])}


def _metric(predicted: np.ndarray, truth: np.ndarray, task: str, full: bool = False) -> dict:
    if task == "classification":
        return {"value": round(accuracy(predicted, truth), 4)}
    metrics = regression_metrics(predicted, truth)
    extra = {"mae": round(metrics["mae"], 6), "r2": round(metrics["r2"], 6)} if full else {}
    return {"value": round(metrics["rmse"], 6), **extra}


def validation_summary(validation: dict | None) -> str:
    """One line for stdout: the overall metric and the metric per number of parties observed."""
    if not validation:
        return ("validation: no labeled record held out ([federation] validation_fraction = 0, or too few labels): "
                "no lift over the active party's own model can be measured, and stage 2 keeps its last epoch")
    unit = " %" if validation["metric"] == "accuracy" else ""
    groups = ", ".join(f"{k} {'party' if k == '1' else 'parties'}: {v['value']:.4g}{unit} ({v['records']})"
                       for k, v in validation["by_parties_observed"].items())
    extra = f", MAE {validation['mae']:.4g}, R^2 {validation['r2']:.3f}" if "mae" in validation else ""
    lead = ""
    if "roc_auc" in validation:
        macro = " (macro, one-vs-rest)" if validation.get("n_classes", 2) > 2 else ""  # (a trial checked it by hand)
        lead = (f"ROC AUC{macro} {validation['roc_auc']:.4f}, balanced accuracy "
                f"{validation['balanced_accuracy']:.2f} %, ")
        extra = f" (the most common class alone: {validation['majority']:.4g} %)"
    return (f"validation ({validation['records']} held-out labeled records): {lead}{validation['metric']} "
            f"{validation['value']:.4g}{unit}{extra}; {validation['metric']} by parties observed: {groups}")


def trees_lines(trees: dict | None) -> list[str]:
    """`head = "network+trees"`: the trees' share of the blend and the validation scores it was chosen by."""
    if not trees:
        return []
    scores, models = trees["validation"], trees.get("models", 1)
    bag = f" in {models} averaged models" if models > 1 else ""
    made = f"trees: {trees['trees']} trees{bag} on {trees['rows']} labeled records take"
    if not scores:
        return [f"{made} {trees['weight']:g} of the blend (no validation records to choose it)"]
    chosen = scores[str(trees["weight"])]
    metric = _METRICS.get(trees.get("metric", ""), "loss")  # (a trial read a standardised RMSE beside the raw one)
    return [f"{made} {trees['weight']:g} of the "
            f"blend (validation {metric} {chosen:.4f}; the discriminator alone {scores['0.0']:.4f}, the trees alone "
            f"{scores['1.0']:.4f})"]


_METRICS = {"log_loss": "log loss", "log_loss_balanced": "log loss weighted by class (class_weight = \"balanced\")",
            "rmse_standardised": "RMSE in the target's standard deviations"}


def selection_lines(selection: dict | None, config: dict | None = None) -> list[str]:
    """A note where stage 2 kept its last epoch: its validation score was still improving when it stopped (a trial's
    large table kept epoch 18 of 18, and nothing said more epochs might help), with the lines that ask for twice
    as many (`config`: the run's, as `Config.to_dict` writes it)."""
    scores = (selection or {}).get("per_epoch") or []
    if len(scores) < 2 or selection.get("best_epoch") != len(scores):
        return []
    return [f"note: stage 2 kept its last epoch ({len(scores)} of {len(scores)}): its validation "
            f"{selection['metric'].replace('_', ' ')} was still improving; more stage-2 epochs may help: "
            + _longer(config, 2 * len(scores))]


def _longer(config: dict | None, epochs: int) -> str:
    """The file's lines for a stage 2 of `epochs`: under the auto schedule (which sizes epochs itself, a trial found
    the advice to set them had no effect) this run's sized schedule, written out, with auto_schedule = false."""
    if not (config or {}).get("auto_schedule"):
        return f"[model.train] epochs = {epochs}"
    one, two = config["pretrain"], config["train"]
    return (f"auto_schedule = false in [model], [model.pretrain] epochs = {one['epochs']} and batch_size = "
            f"{one['batch_size']}, [model.train] epochs = {epochs} and batch_size = {two['batch_size']}")


def still_out(events: list[dict]) -> list[dict]:
    """The loss events (`train_result.json`'s `lost_parties`) of the parties that did not come back."""
    last = {e["party"]: e for e in events}
    return [e for e in last.values() if e["how"] != "rejoined"]


def lost_lines(events: list[dict]) -> list[str]:
    """A warning per party that left training for good: its model folder holds what it had before."""
    return [f"warning: {e['party']} left training (stage {e['stage']}, epoch {e['epoch']}): its part of the model "
            f"is from before; predict with --absent {e['party']}" for e in still_out(events)]
