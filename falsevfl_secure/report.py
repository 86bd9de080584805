"""How a run's result is shown: the seven accuracies first, then what crossed the wire, and a plot."""

from __future__ import annotations

import io
from pathlib import Path

from .fsio import atomic_write
from .methods import method_named
from .runtime.records import RunResult
from .transport.accounting import per_round


def print_result(result: RunResult, out: Path) -> None:
    print(f"\n{'test pattern':<12}{'accuracy %':>11}{'parties observed':>18}")
    for pattern, accuracy in result.accuracy.items():
        print(f"{pattern:<12}{accuracy:>11.2f}{100 * result.observed_fraction[pattern]:>17.0f}%")
    rows, timed = per_round(result.communication, result.timed), result.timed
    print(f"\n{'round':<16}{'messages':>10}{'MiB on the wire':>17}{'largest |addend|':>18}"
          + (f"{'seconds':>10}" if timed else ""))
    for r in rows:
        seconds = f"{r['seconds']:>10.2f}" if timed else ""
        peak = f"{r['peak']:>18.4g}" if r["peak"] else f"{'':>18}"
        print(f"{r['round']:<16}{r['messages']:>10}{r['bytes'] / 2**20:>17.2f}{peak}{seconds}")
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in result.stage_time_s.items())
    print(f"\n{result.protocol}/{result.runtime}: wall time {result.wall_time_s:.1f} s ({stages})")
    for stage, split in (result.stage_split or {}).items():
        print(f"  {stage} at the active party: compute {split['compute_s']:.1f} s, protocol work in rounds "
              f"{split['protocol_s']:.1f} s, waiting on the network {split['network_s']:.1f} s")
    print(f"results: {out / 'result.json'} and {out / 'result.png'}")
    if result.audit is not None:
        _print_audit(result.audit)


def _print_audit(audit: dict) -> None:
    print(f"\naudit ({audit['protocol']}): {audit['views_audited']} views, {audit['entries_checked']} entries checked, "
          f"{audit['leaks_found']} leaks found, {audit['disclosed_by_design_rows']} rows disclosed by design "
          f"(held by one passive party); expected: {audit['expected']}")
    for leak in audit["leaks"][:5]:
        print(f"  leak: {leak}")


def plot_result(result: RunResult, path: Path) -> None:
    """Accuracy per test pattern, with the fraction of parties observed under each pattern."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, names = result.config, list(result.accuracy)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bars = ax.bar(names, [result.accuracy[n] for n in names], color="#4c72b0", label="test accuracy")
    for bar, name in zip(bars, names, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1, f"{result.accuracy[name]:.1f}",
                ha="center", fontsize=8)
    fraction = ax.twinx()
    fraction.plot(names, [100 * result.observed_fraction[n] for n in names], "o--", color="#dd8452",
                  label="parties observed (%)")
    fraction.set_ylim(0, 105)
    fraction.set_ylabel("parties observed (%)", color="#dd8452")
    ax.set(ylim=(0, 105), ylabel="test accuracy (%)", xlabel="test pattern (missingness at test time)")
    label = method_named(cfg["method"])(cfg["options"]).label
    ax.set_title(f"{label} on {cfg['dataset']}, K={cfg['parties']}, trained under "
                 f"{cfg['train_mechanism']}, {result.protocol}/{result.runtime}", fontsize=9)
    fig.legend(loc="lower left", fontsize=8, bbox_to_anchor=(0.08, 0.14))
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, image.getvalue())  # a failed plot leaves the previous result.png whole
