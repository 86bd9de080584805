"""Missing cells inside held blocks: the mask input against mean imputation.

    python bench/missing_cells.py --dataset digits --seeds 0 1 2 --out bench/results/missing-cells-digits
    python bench/missing_cells.py --dataset isolet --preset quick --seeds 0 --out bench/results/missing-cells-isolet

For every seed and fraction of removed cells (`--rates`, default 0, 0.1, 0.3: each cell of a block a party
holds is removed with that probability, in training and in every test split, `Config.cell_missing`), train
FALSE-VFL-I under the training mechanism and evaluate the seven test patterns, once per way of treating the
empty cells (`Config.cell_handling`): `mask` (the encoder sees which cells are empty, the decoder's
likelihood covers the observed cells only) and `mean` (empty cells mean-imputed and treated as observed).
At rate 0 there is no empty cell and both compute exactly the same (tests/test_missing_cells.py): one
run stands for both.

The arms of one seed are paired: the same split, the same removed cells, and the same role secrets
(`RoleSecret.for_tests(seed, party)`, a benchmark's fixed secrets, so the arms start from the same weights
and draw the same noise; a real run draws fresh ones), so their difference is the treatment's.

`--reference-tree DIR` also runs the fully observed configurations (same seeds, schedule and secrets) with
the code of another checkout (e.g. the commit before the cell path), in a subprocess with that checkout on
PYTHONPATH, and the report says whether they give the same accuracies, test pattern by test pattern.

Writes DIR/missing_cells.json after every run (a killed benchmark resumes), then DIR/missing_cells.md
(accuracy per test pattern, mean ± std over seeds, and the paired difference mask − mean) and
DIR/missing_cells.png; `--readme FILE` rewrites FILE's section between `<!-- results:NAME:start -->` and
`<!-- results:NAME:end -->` (NAME: the --out folder's name).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from readme_section import relative_link, update_readme  # noqa: E402

from falsevfl_secure.cli import guarded  # noqa: E402
from falsevfl_secure.config import Config  # noqa: E402
from falsevfl_secure.data import TEST_PATTERNS, data_root  # noqa: E402
from falsevfl_secure.fsio import write_json  # noqa: E402
from falsevfl_secure.methods import make_config  # noqa: E402

HANDLINGS = ("mask", "mean")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--preset", choices=["default", "paper", "quick"], default="default")
    p.add_argument("--pretrain-epochs", type=int, default=None)
    p.add_argument("--train-epochs", type=int, default=None)
    p.add_argument("--train", default="mcar:0.2", help="training mechanism")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rates", nargs="+", type=float, default=[0.0, 0.1, 0.3], help="fractions of cells removed")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--out", default="runs/missing-cells")
    p.add_argument("--reference-tree", default=None, help="another checkout: its fully observed runs, compared")
    p.add_argument("--readme", default=None, help="rewrite this file's generated results section")
    p.add_argument("--report-only", action="store_true", help="no training: tables and plot from the JSON")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def planned(args) -> list[tuple[Config, dict]]:
    """(config, cell metadata) of every run: rate 0 once, every other rate once per handling."""
    runs = []
    for seed in args.seeds:
        for rate in args.rates:
            for handling in HANDLINGS[:1] if rate == 0 else HANDLINGS:
                cfg = make_config(args.dataset, args.preset, train_mechanism=args.train, seed=seed,
                                  cell_missing=rate, cell_handling=handling, device="cpu")
                if args.pretrain_epochs is not None:
                    cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=args.pretrain_epochs))
                if args.train_epochs is not None:
                    cfg = replace(cfg, train=replace(cfg.train, epochs=args.train_epochs))
                meta = {"dataset": cfg.dataset, "preset": args.preset, "train": cfg.train_mechanism,
                        "epochs": [cfg.pretrain.epochs, cfg.train.epochs], "seed": seed, "cell_missing": rate,
                        "cell_handling": handling if rate else "either"}
                runs.append((cfg.validate(), meta))
    return runs


def key(c: dict) -> tuple:
    return c["dataset"], c["preset"], c["train"], tuple(c["epochs"]), c["seed"], c["cell_missing"], c["cell_handling"]


def run_one(cfg: Config, progress: bool) -> dict:
    """One training run with the seed's fixed secrets; accuracy per test pattern, times, empty-cell share."""
    from falsevfl_secure.randomness import RoleSecret
    from falsevfl_secure.runtime.local import run_local

    secrets = {k: RoleSecret.for_tests(cfg.seed, k) for k in range(cfg.parties)}
    result = run_local(cfg, TEST_PATTERNS, progress=progress, secrets=secrets)
    return {"accuracy": result.accuracy, "wall_time_s": result.wall_time_s, "stage_time_s": result.stage_time_s,
            "samples": result.samples, "dropped": result.dropped_no_observed_party}


# Runs in the reference checkout: only what every version of the package has (no cell settings).
REFERENCE_RUN = """
import json, sys
from dataclasses import replace
import torch
from falsevfl_secure.config import make_config
from falsevfl_secure.data import TEST_PATTERNS
from falsevfl_secure.randomness import RoleSecret
from falsevfl_secure.runtime.local import run_local
dataset, preset, train, seed, pre, post, threads = sys.argv[1:]
torch.set_num_threads(int(threads))
cfg = make_config(dataset, preset, train_mechanism=train, seed=int(seed), device="cpu")
cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=int(pre)), train=replace(cfg.train, epochs=int(post)))
secrets = {k: RoleSecret.for_tests(cfg.seed, k) for k in range(cfg.parties)}
result = run_local(cfg, TEST_PATTERNS, progress=False, secrets=secrets)
print(json.dumps({"accuracy": result.accuracy, "wall_time_s": result.wall_time_s}))
"""


def run_reference(tree: str, meta: dict, threads: int) -> dict:
    """The fully observed run of `meta` with the package of checkout `tree` (a subprocess)."""
    argv = [meta["dataset"], meta["preset"], meta["train"], str(meta["seed"]), *map(str, meta["epochs"]), str(threads)]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    if meta["dataset"] != "digits":  # the same data files as this checkout's runs read
        env["FALSEVFL_DATA"] = str(data_root())
    done = subprocess.run([sys.executable, "-c", REFERENCE_RUN, *argv], cwd=tree, capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode:
        raise SystemExit(f"error: the reference run in {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reference_line(group: list[dict]) -> list[str]:
    """Whether the fully observed runs equal the reference checkout's, per seed."""
    by = {(c["seed"], c["cell_handling"]): c for c in group if c["cell_missing"] == 0}
    seeds = sorted(s for s, h in by if h == "reference" and (s, "either") in by)
    if not seeds:
        return []
    same = [s for s in seeds if by[(s, "reference")]["accuracy"] == by[(s, "either")]["accuracy"]]
    return [f"Fully observed runs against the reference checkout ({by[(seeds[0], 'reference')]['reference']}), same "
            f"secrets: identical accuracies on all seven test patterns for {len(same)} of {len(seeds)} seeds"
            + (f" (differing: {sorted(set(seeds) - set(same))})" if len(same) < len(seeds) else "") + ".", ""]


def table(cells: list[dict]) -> str:
    """Mean ± std over seeds per (rate, handling) and test pattern, then the paired mask − mean gaps."""
    lines = []
    for dataset, preset, train, epochs in sorted({(c["dataset"], c["preset"], c["train"], tuple(c["epochs"]))
                                                  for c in cells}):
        group = [c for c in cells if (c["dataset"], c["preset"], c["train"], tuple(c["epochs"]))
                 == (dataset, preset, train, epochs)]
        seeds = sorted({c["seed"] for c in group})
        lines += [f"**{dataset}**, preset {preset} ({epochs[0]} + {epochs[1]} epochs), FALSE-VFL-I trained under "
                  f"{train}, seeds {', '.join(map(str, seeds))} (accuracy %, mean ± std over seeds)", "",
                  "| cells removed | empty cells | " + " | ".join(TEST_PATTERNS) + " | mean of 7 | n | wall s |",
                  "|---|---|" + "---|" * (len(TEST_PATTERNS) + 3)]
        for rate, handling in sorted({(c["cell_missing"], c["cell_handling"]) for c in group
                                      if c["cell_handling"] != "reference"}):
            runs = [c for c in group if (c["cell_missing"], c["cell_handling"]) == (rate, handling)]
            acc = np.array([[c["accuracy"][t] for t in TEST_PATTERNS] for c in runs])
            row = " | ".join(f"{m:.1f} ± {s:.1f}" for m, s in zip(acc.mean(0), acc.std(0), strict=True))
            mean7 = acc.mean(1)
            lines.append(f"| {rate:.0%} | {handling} | {row} | {mean7.mean():.1f} ± {mean7.std():.1f} | {len(runs)} "
                         f"| {np.mean([c['wall_time_s'] for c in runs]):.0f} |")
        lines += ["", *reference_line(group), *gaps(group), ""]
    return "\n".join(lines)


def gaps(group: list[dict]) -> list[str]:
    """Per removed fraction: mask − mean (paired by seed) and each handling's cost against rate 0."""
    by = {(c["seed"], c["cell_missing"], c["cell_handling"]): c for c in group}

    def mean7(c: dict) -> float:
        return float(np.mean([c["accuracy"][t] for t in TEST_PATTERNS]))

    rows = ["| cells removed | mask − mean, mcar:0 | mask − mean, mean of 7 | cost of the empty cells, mask "
            "| cost, mean | seeds |", "|---|---|---|---|---|---|"]
    for rate in sorted({c["cell_missing"] for c in group if c["cell_missing"] > 0}):
        seeds = [s for s in sorted({c["seed"] for c in group}) if all((s, rate, h) in by for h in HANDLINGS)]
        if not seeds:
            continue
        pairs = [(by[(s, rate, "mask")], by[(s, rate, "mean")], by.get((s, 0.0, "either"))) for s in seeds]
        d0 = [a["accuracy"]["mcar:0"] - b["accuracy"]["mcar:0"] for a, b, _ in pairs]
        d7 = [mean7(a) - mean7(b) for a, b, _ in pairs]
        costs = [[mean7(full) - mean7(arm) for arm, full in ((a, f), (b, f))] for a, b, f in pairs if f]
        cost = [f"{np.mean(c):+.1f} ± {np.std(c):.1f}" for c in zip(*costs, strict=True)] if costs else ["-", "-"]
        rows.append(f"| {rate:.0%} | {np.mean(d0):+.1f} ± {np.std(d0):.1f} | {np.mean(d7):+.1f} ± {np.std(d7):.1f} "
                    f"| {cost[0]} | {cost[1]} | {len(seeds)} |")
    rows.append("")
    rows.append("Differences are in percentage points, mean ± std over seeds of the paired per-seed difference; "
                "the cost is the fully observed run's mean-of-7 accuracy minus the arm's (smaller is better).")
    return rows


def plot(cells: list[dict], path: Path) -> None:
    """Accuracy against the fraction of removed cells, one line per handling (rate 0 shared), per dataset:
    test pattern mcar:0 and the mean of the seven patterns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({c["dataset"] for c in cells})
    fig, axes = plt.subplots(len(datasets), 2, figsize=(8, 3.2 * len(datasets)), squeeze=False)
    for i, dataset in enumerate(datasets):
        group = [c for c in cells if c["dataset"] == dataset]
        rates = sorted({c["cell_missing"] for c in group})
        for j, (title, value) in enumerate((("test pattern mcar:0", lambda c: c["accuracy"]["mcar:0"]),
                                            ("mean of the 7 test patterns",
                                             lambda c: np.mean([c["accuracy"][t] for t in TEST_PATTERNS])))):
            ax = axes[i][j]
            for handling, colour in zip(HANDLINGS, ("#4c72b0", "#dd8452"), strict=True):
                points = [(r, [value(c) for c in group if c["cell_missing"] == r
                               and c["cell_handling"] in (handling, "either")]) for r in rates]
                points = [(r, v) for r, v in points if v]
                xs = np.array([100 * r for r, _ in points])
                ys, es = np.array([np.mean(v) for _, v in points]), np.array([np.std(v) for _, v in points])
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=colour, label=handling)
            ax.set_title(f"{dataset}: {title}", fontsize=9)
            ax.set_xlabel("cells removed inside held blocks (%)")
            ax.set_ylabel("test accuracy (%)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(cells: list[dict], out: Path, readme: str | None) -> None:
    text = table(cells)
    (out / "missing_cells.md").write_text(text + "\n")
    plot(cells, out / "missing_cells.png")
    print("\n" + text)
    if readme:
        image = f"![missing cells]({relative_link(out / 'missing_cells.png', Path(readme))})"
        update_readme(Path(readme), out.resolve().name, f"{text}\n{image}\n")
        print(f"rewrote the results section of {readme}")


def references(args, cells: list[dict], path: Path) -> None:
    """The reference checkout's fully observed runs that are not in the JSON yet."""
    tree = Path(args.reference_tree)
    label = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           check=False).stdout.strip() or tree.resolve().name
    done = {key(c) for c in cells}
    for _, meta in planned(args):
        meta = {**meta, "cell_handling": "reference", "reference": label}
        if meta["cell_missing"] == 0 and key(meta) not in done:
            cells.append({**meta, **run_reference(str(tree), meta, args.threads)})
            write_json(path, cells)
            print(f"reference {label} seed {meta['seed']}: {cells[-1]['accuracy']}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    path = out / "missing_cells.json"
    cells: list[dict] = json.loads(path.read_text()) if path.exists() else []
    if not args.report_only:
        import torch

        torch.set_num_threads(args.threads)
        done = {key(c) for c in cells}
        todo = [(cfg, meta) for cfg, meta in planned(args) if key(meta) not in done]
        print(f"{len(todo)} runs to do ({len(done)} already in {path})", flush=True)
        started = time.perf_counter()
        for cfg, meta in todo:
            result = run_one(cfg, not args.quiet)
            cells.append({**meta, **result})
            write_json(path, cells)
            print(f"[{time.perf_counter() - started:6.0f} s] {meta['dataset']} seed {meta['seed']} "
                  f"{meta['cell_missing']:.0%} {meta['cell_handling']}: "
                  + " ".join(f"{t}={a:.1f}" for t, a in result["accuracy"].items())
                  + f" ({result['wall_time_s']:.0f} s)", flush=True)
    if args.reference_tree and not args.report_only:
        references(args, cells, path)
    if not cells:
        print(f"error: no results in {path}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    report(cells, out, args.readme)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
