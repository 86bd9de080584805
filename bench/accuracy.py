"""Accuracy against the paper: train with a preset and evaluate the seven test patterns.

    python bench/accuracy.py --dataset isolet --train mcar:0.2 --variant I --seeds 0 1 2 --preset paper --out DIR

Writes DIR/accuracy.json (a list of cells {"dataset", "train", "test", "variant", "seed", "accuracy",
"wall_time_s"}) after every finished run, so a killed benchmark resumes where it stopped (finished
runs are not recomputed), and DIR/accuracy.png (mean and std per test pattern, one panel per
training mechanism). Prints a table next to the paper's numbers where DESIGN.md gives them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falsevfl_secure.config import make_config  # noqa: E402
from falsevfl_secure.data import TEST_PATTERNS  # noqa: E402
from falsevfl_secure.runtime.local import run_local  # noqa: E402
from falsevfl_secure.simulate import write_json_atomic  # noqa: E402

# The paper's FALSE-VFL-I accuracy (%), trained under MCAR 0.2, mean of 5 runs (DESIGN.md).
PAPER = {
    ("isolet", "mcar:0.2", "I"): dict(zip(TEST_PATTERNS, (86.3, 82.6, 65.2, 52.0, 55.4, 65.5, 64.7), strict=True)),
    ("hapt", "mcar:0.2", "I"): dict(zip(TEST_PATTERNS, (89.0, 85.4, 73.3, 73.8, 73.7, 69.8, 68.5), strict=True)),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="isolet")
    p.add_argument("--train", nargs="+", default=["mcar:0.2"], help="training mechanisms")
    p.add_argument("--variant", nargs="+", default=["I"], choices=["I", "II"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--preset", choices=["paper", "quick"], default="paper")
    p.add_argument("--parties", type=int, default=None)
    p.add_argument("--pretrain-epochs", type=int, default=None)
    p.add_argument("--train-epochs", type=int, default=None)
    p.add_argument("--out", default="runs/accuracy")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def summarise(cells: list[dict]) -> dict[tuple, tuple[float, float, int]]:
    groups: dict[tuple, list[float]] = {}
    for c in cells:
        key = (c["dataset"], c["train"], c["variant"], c.get("parties"), c["test"])
        groups.setdefault(key, []).append(c["accuracy"])
    return {k: (float(np.mean(v)), float(np.std(v)), len(v)) for k, v in groups.items()}


def print_table(cells: list[dict]) -> None:
    stats = summarise(cells)
    runs = sorted({k[:4] for k in stats}, key=str)
    for run in runs:
        dataset, train, variant, parties = run
        paper = PAPER.get((dataset, train, variant)) if parties in (None, 8) else None
        print(f"\n{dataset} FALSE-VFL-{variant} trained {train}" + (f" K={parties}" if parties else ""))
        print(f"{'test':<10}{'ours (mean ± std, n)':>24}{'paper':>8}{'diff':>8}")
        for test in TEST_PATTERNS:
            if (*run, test) not in stats:
                continue
            mean, std, n = stats[(*run, test)]
            ref = paper.get(test) if paper else None
            ref_s = f"{ref:8.1f}{mean - ref:+8.1f}" if ref is not None else f"{'-':>8}{'':>8}"
            print(f"{test:<10}{mean:>14.1f} ± {std:4.1f} ({n}){ref_s}")


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summarise(cells)
    panels = sorted({k[:4] for k in stats}, key=str)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, run in zip(axes[0], panels, strict=True):
        tests = [t for t in TEST_PATTERNS if (*run, t) in stats]
        means = [stats[(*run, t)][0] for t in tests]
        stds = [stats[(*run, t)][1] for t in tests]
        x = np.arange(len(tests))
        ax.bar(x - 0.2, means, 0.4, yerr=stds, label="ours", color="#4c72b0", capsize=2)
        paper = PAPER.get(run[:3]) if run[3] in (None, 8) else None
        if paper:
            ax.bar(x + 0.2, [paper[t] for t in tests], 0.4, label="paper", color="#dd8452")
            ax.legend(fontsize=7)
        ax.set_xticks(x, tests, rotation=45, fontsize=7)
        ax.set_ylim(0, 100)
        ax.set_title(f"{run[0]} {run[2]} train {run[1]}", fontsize=8)
        ax.set_ylabel("accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    path = out / "accuracy.json"
    cells: list[dict] = json.loads(path.read_text()) if path.exists() else []
    done = {(c["dataset"], c["train"], c["variant"], c["seed"], c.get("parties"), c.get("preset")) for c in cells}
    for variant in args.variant:
        for train in args.train:
            for seed in args.seeds:
                cfg = make_config(args.dataset, args.preset, parties=args.parties, variant=variant,
                                  train_mechanism=train, seed=seed)
                key = (cfg.dataset, train, variant, seed, cfg.parties, args.preset)
                if key in done:
                    continue
                from dataclasses import replace

                if args.pretrain_epochs is not None:
                    cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=args.pretrain_epochs))
                if args.train_epochs is not None:
                    cfg = replace(cfg, train=replace(cfg.train, epochs=args.train_epochs))
                print(f"== {cfg.dataset} variant {variant} train {train} seed {seed} K={cfg.parties}", flush=True)
                result = run_local(cfg, progress=not args.quiet)
                for test, acc in result["accuracy"].items():
                    cells.append({"dataset": cfg.dataset, "train": train, "test": test, "variant": variant,
                                  "seed": seed, "parties": cfg.parties, "preset": args.preset,
                                  "accuracy": acc, "wall_time_s": result["wall_time_s"],
                                  "stage_time_s": result["stage_time_s"]})
                write_json_atomic(path, cells)
                print("   " + "  ".join(f"{t}={a:.1f}" for t, a in result["accuracy"].items())
                      + f"  ({result['wall_time_s']:.0f} s)", flush=True)
    print_table(cells)
    plot(cells, out / "accuracy.png")
    print(f"\nresults: {path} and {out / 'accuracy.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
