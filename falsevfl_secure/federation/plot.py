"""`train_result.png` beside the active party's `train_result.json`: how training went and whether it paid.

Three panels from the record alone: stage 1's loss per epoch (the negative IWAE bound), stage 2's validation
score per epoch with the epoch kept (or its training loss, without validation records), and the lift: the
federation against the active party's own models on the validation records, in the lift's metric.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..fsio import atomic_write

_BLUE, _GREY, _ORANGE = "#4c72b0", "#8c8c8c", "#dd8452"


def plot_training(record: dict, path: Path | str) -> None:
    """The three panels of `record` (a `train_result.json`) as a PNG at `path` (written whole or not at all)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    _stage1(axes[0], record["losses"].get("pretrain", []), record.get("resumed_after_epochs", {}).get("pretrain", 0))
    _stage2(axes[1], record.get("selection"), record["losses"].get("train", []),
            record.get("resumed_after_epochs", {}).get("train", 0))
    _lift(axes[2], record.get("lift"))
    alignment = record["alignment"]
    fig.suptitle(f"{record['config'].get('method', '')} under {record['protocol']}: "
                 f"{len(alignment['rows_per_party'])} parties, {alignment['records']} records aligned, "
                 f"{alignment['labeled']} labeled; trained in {record['wall_time_s']:.0f} s", fontsize=9)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, image.getvalue())


def _stage1(ax, losses: list[float], before: int = 0) -> None:
    """`before`: the epochs a resumed run had done (their losses are not in this run's record)."""
    ax.plot(range(before + 1, before + len(losses) + 1), losses, color=_BLUE)
    resumed = f" (resumed after epoch {before})" if before else ""
    ax.set(title=f"stage 1: loss (negative IWAE bound){resumed}", xlabel="epoch", ylabel="loss")
    ax.title.set_fontsize(9)


def _stage2(ax, selection: dict | None, losses: list[float], before: int = 0) -> None:
    """The validation score of every epoch (a resumed run's selection keeps them all), or this run's losses."""
    if selection and selection.get("per_epoch"):
        scores = selection["per_epoch"]
        ax.plot(range(1, len(scores) + 1), scores, color=_BLUE)
        best = selection["best_epoch"]  # counted from 1
        ax.plot([best], [scores[best - 1]], "o", color=_ORANGE, label=f"kept: epoch {best}")
        ax.legend(fontsize=8)
        ax.set(title=f"stage 2: validation {selection['metric']}", xlabel="epoch", ylabel=selection["metric"])
    else:
        ax.plot(range(before + 1, before + len(losses) + 1), losses, color=_BLUE)
        resumed = f", resumed after epoch {before}" if before else ""
        ax.set(title=f"stage 2: training loss (no validation records{resumed})", xlabel="epoch", ylabel="loss")
    ax.title.set_fontsize(9)


def _lift(ax, lift: dict | None) -> None:
    if not lift:
        ax.text(0.5, 0.5, "no validation records: no lift", ha="center", va="center", fontsize=9)
        ax.set_axis_off()
        return
    metric = lift["metric"]
    names = ["federation", *(f"active alone, {k}" for k in lift["active_alone"])]
    values = [lift["federation"][metric], *(v[metric] for v in lift["active_alone"].values())]
    bars = ax.bar(range(len(names)), values, color=[_BLUE, *[_GREY] * (len(names) - 1)])
    for bar, value in zip(bars, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{value:.4g}", ha="center", va="bottom",
                fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    low = min(values)
    ax.set(title=f"validation {metric} ({lift['records']} records; lift {lift['lift']:+.4g})", ylabel=metric,
           ylim=(0.9 * low if metric == "roc_auc" else 0, 1.08 * max(values)))
    ax.title.set_fontsize(9)
