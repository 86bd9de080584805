"""Accuracy against the paper: train with a preset and evaluate the seven test patterns.

    python bench/accuracy.py --dataset isolet --train mcar:0.2 --seeds 0 1 2 --preset paper --out DIR
    python bench/accuracy.py --dataset isolet --methods false-vfl-i false-vfl-ii vanilla laser plugvfl fedhssl --out DIR
    python bench/accuracy.py --dataset isolet --train mcar:0.2 mnar:0.7 --parties 4 6 8 10 12 --out DIR   # K ablation

Every (dataset, training mechanism, method, K, seed, overrides) run is one cell group (`--variant I II` is
the older spelling of `--methods false-vfl-i false-vfl-ii`; a baseline trains with its own schedule for
the preset, its `schedules`, methods/). Writes, after every finished run, DIR/accuracy.json (a list of
cells {"dataset", "train", "test", "method", "variant", "seed", "parties", "preset", "overrides",
"accuracy", "wall_time_s", "stage_time_s", "device"}), so a killed benchmark resumes where it stopped
(finished runs are never recomputed); at the end DIR/accuracy.md (mean ± std per test pattern, next to
the paper's row where the paper gives one), DIR/accuracy.png (one figure per dataset and method, like the
paper's: bars per test pattern, one panel per training mechanism), when several methods were run
DIR/methods.png (every method per test pattern, the paper's rows as markers) and, when several K were
run, DIR/parties.png (accuracy against K, trained and tested under the same mechanism, as in the paper's
ablation).

`--jobs N` runs N cells at once in separate processes (each with `--threads` torch threads): on a
GPU machine the small networks leave most of the device idle, so several runs share it well.
`--readme FILE` rewrites the generated results section of FILE (between its markers
`<!-- results:NAME:start -->` and `<!-- results:NAME:end -->`, NAME being the --out folder's name)
from the JSON, so the README never holds hand-typed numbers.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import multiprocessing as mp
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from readme_section import relative_link, update_readme  # noqa: E402

from falsevfl_secure.cli import guarded  # noqa: E402
from falsevfl_secure.config import Config  # noqa: E402
from falsevfl_secure.data import TEST_PATTERNS, TRAIN_MECHANISMS  # noqa: E402
from falsevfl_secure.fsio import write_json  # noqa: E402
from falsevfl_secure.methods import make_config, method_for, method_labels, parse_method  # noqa: E402


def _row(*values: float) -> dict[str, float]:
    return dict(zip(TEST_PATTERNS, values, strict=True))


# The paper's accuracy (%), trained under MCAR 0.2, mean of 5 runs (DESIGN.md; issue 21 for the baselines).
PAPER = {
    ("isolet", "mcar:0.2", "false-vfl-i"): _row(86.3, 82.6, 65.2, 52.0, 55.4, 65.5, 64.7),
    ("isolet", "mcar:0.2", "vanilla"): _row(76.6, 64.5, 40.1, 28.3, 28.5, 41.3, 41.4),
    ("isolet", "mcar:0.2", "laser"): _row(69.3, 63.1, 51.0, 44.0, 45.1, 52.5, 51.7),
    ("isolet", "mcar:0.2", "plugvfl"): _row(84.5, 75.8, 52.8, 40.4, 39.4, 53.9, 53.5),
    ("isolet", "mcar:0.2", "fedhssl"): _row(75.1, 68.2, 46.5, 34.4, 35.3, 48.2, 48.3),
    ("hapt", "mcar:0.2", "false-vfl-i"): _row(89.0, 85.4, 73.3, 73.8, 73.7, 69.8, 68.5),
}
NAMES = {"false-vfl-i": "FALSE-VFL-I", "false-vfl-ii": "FALSE-VFL-II", "vanilla": "Vanilla VFL", "laser": "LASER-VFL",
         "plugvfl": "PlugVFL", "fedhssl": "FedHSSL"}
METHOD_ORDER = tuple(NAMES)  # the paper's order of its tables
PAPER_K = 8  # the paper's number of parties for these rows


def parse_override(text: str) -> tuple[str, object]:
    """`name=value` for a Config field; the value is read as JSON (numbers, true/false) or kept as text."""
    name, sep, raw = text.partition("=")
    if not sep or name not in Config.__dataclass_fields__ or name in ("pretrain", "train"):
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected FIELD=VALUE with FIELD a Config field "
                                         "(use --pretrain-epochs / --train-epochs for the schedules)")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return name, value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="isolet")
    p.add_argument("--train", nargs="+", default=["mcar:0.2"], help="training mechanisms")
    p.add_argument("--methods", nargs="+", default=None, choices=list(method_labels()),
                   help="the methods to run (default false-vfl-i)")
    p.add_argument("--variant", nargs="+", default=None, choices=["I", "II"],
                   help="FALSE-VFL's variants: --variant I II is --methods false-vfl-i false-vfl-ii")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--preset", choices=["paper", "paper-protocol", "quick"], default="paper",
                   help="paper: the paper's schedules as this project reads them; paper-protocol: under the readings "
                        "of its protocol that reproduce its rows best (config.PAPER_PROTOCOL, the methods' schedules)")
    p.add_argument("--parties", nargs="+", type=int, default=[None], help="K (default: the preset's)")
    p.add_argument("--pretrain-epochs", type=int, default=None)
    p.add_argument("--train-epochs", type=int, default=None)
    p.add_argument("--set", dest="overrides", action="append", type=parse_override, default=[],
                   metavar="FIELD=VALUE", help="override a Config field, e.g. --set party_hidden=128")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--jobs", type=int, default=1, help="cells run at once, one process each")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run")
    p.add_argument("--out", default="runs/accuracy")
    p.add_argument("--checkpoints", default=None, metavar="DIR",
                   help="keep each run's per-epoch checkpoints under DIR (a killed run resumes from its last epoch)")
    p.add_argument("--wait-while", default=None, metavar="FILE",
                   help="before starting each run, wait while FILE exists (someone is timing on this machine)")
    p.add_argument("--readme", default=None, help="rewrite this file's generated results section")
    p.add_argument("--report-only", action="store_true", help="no training: tables and plots from the JSON")
    p.add_argument("--steps", action="store_true",
                   help="the report also counts each run's optimiser steps per stage (seed 0's public plan)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def method_of(c: dict) -> str:
    """A cell's method label (cells written before --methods name FALSE-VFL's variant only)."""
    return c.get("method") or f"false-vfl-{c['variant'].lower()}"


def run_key(c: dict) -> tuple:
    """What a table row or plot series is: everything but the seed and the test pattern."""
    return (c["dataset"], c["train"], method_of(c), c.get("parties"), c.get("preset"),
            json.dumps(c.get("overrides") or {}, sort_keys=True))


def methods_asked(args) -> list[str]:
    """--methods, or --variant (its alias for FALSE-VFL), or FALSE-VFL-I."""
    variants = [f"false-vfl-{v.lower()}" for v in args.variant or []]
    return list(dict.fromkeys([*(args.methods or []), *variants])) or ["false-vfl-i"]


def cell_key(c: dict) -> tuple:
    """One training run: its series and its seed (a finished run is never recomputed)."""
    return (*run_key(c), c["seed"])


def planned_configs(args) -> list[tuple[Config, dict]]:
    configs = []
    overrides = dict(args.overrides)
    # A schedule given on the command line is part of what a cell records (its label and its resume key).
    schedule = {f"{stage}_epochs": n for stage, n in (("pretrain", args.pretrain_epochs), ("train", args.train_epochs))
                if n is not None}
    for label in methods_asked(args):
        method, options = parse_method(label)
        for train in args.train:
            for parties in args.parties:
                for seed in args.seeds:
                    cfg = make_config(args.dataset, args.preset, parties=parties, method=method,
                                      **{**options, **overrides}, train_mechanism=train, seed=seed, device=args.device)
                    if args.pretrain_epochs is not None:
                        cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=args.pretrain_epochs))
                    if args.train_epochs is not None:
                        cfg = replace(cfg, train=replace(cfg.train, epochs=args.train_epochs))
                    configs.append((cfg, {**overrides, **schedule}))
    return configs


def run_cell(cfg: Config, threads: int | None, progress: bool, checkpoints: str | None = None) -> dict:
    """One training run (in a worker process when --jobs > 1): the accuracy per test pattern. With
    `checkpoints`, the run saves every epoch under a folder named by its configuration's fingerprint and
    continues from there if an earlier, killed run left one (the folder is removed when the run ends)."""
    import shutil

    import torch

    from falsevfl_secure.checkpoint import check_resumable
    from falsevfl_secure.errors import InputError
    from falsevfl_secure.runtime.local import run_local

    if threads is not None:
        torch.set_num_threads(threads)
    folder, resume = (Path(checkpoints) / cfg.fingerprint(), False) if checkpoints else (None, False)
    if folder is not None and folder.is_dir():
        try:
            check_resumable(folder, range(cfg.parties), cfg)
            resume = True
        except InputError:
            resume = False
    result = run_local(cfg, progress=progress, checkpoint_dir=folder, resume=resume)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    final = {stage: losses[-1] for stage, losses in result.losses.items() if losses}
    return {"accuracy": result.accuracy, "observed": result.observed_fraction, "wall_time_s": result.wall_time_s,
            "stage_time_s": result.stage_time_s, "final_loss": final, "device": result.device,
            "threads": torch.get_num_threads()}


def run_config(run: tuple, seed: int = 0) -> Config:
    """The configuration of a table row's runs (their seed aside)."""
    dataset, train, label, parties, preset, overrides = run
    extra = json.loads(overrides)
    method, options = parse_method(label)
    epochs = {stage: extra.pop(f"{stage}_epochs") for stage in ("pretrain", "train") if f"{stage}_epochs" in extra}
    cfg = make_config(dataset, preset, parties=parties, method=method, **{**options, **extra}, train_mechanism=train,
                      seed=seed, device="cpu")
    return replace(cfg, **{stage: replace(getattr(cfg, stage), epochs=n) for stage, n in epochs.items()}).validate()


def step_budget(cfg: Config) -> dict[str, int]:
    """The optimiser steps of each stage: the method's public plan of every epoch after the step cap (no
    training: the plan follows from the public seed and the split)."""
    import torch

    from falsevfl_secure.config import Stage
    from falsevfl_secure.data import make_splits
    from falsevfl_secure.methods import method_for
    from falsevfl_secure.node import host_split

    dataset, train, _ = make_splits(cfg, ())
    data = host_split(train.view(range(cfg.parties), True), torch.device("cpu"), dataset.n_classes)
    method, steps = method_for(cfg), {}
    for stage in (Stage.PRETRAIN, Stage.TRAIN):
        schedule = cfg.schedule(stage)
        plans = (method.plan(stage, data, epoch, cfg.seed, schedule.batch_size) for epoch in range(schedule.epochs))
        steps[stage.key] = sum(min(len(plan), schedule.steps_per_epoch or len(plan)) for plan in plans)
    return steps


def steps_table(cells: list[dict]) -> list[str]:
    """Per run, its stages' optimiser steps (seed 0) and its stage-2 batch size: the step budgets compared."""
    runs = sorted({run_key(c) for c in cells}, key=run_order)
    lines = ["| run (seed 0) | stage-1 steps | stage-2 steps | stage-2 batch size |", "|---|---|---|---|"]
    for run in runs:
        cfg = run_config(run)
        steps = step_budget(cfg)
        lines.append(f"| {describe(run)} | {steps['pretrain']:,} | {steps['train']:,} | {cfg.train.batch_size} |")
    return [*lines, ""]


def summarise(cells: list[dict]) -> dict[tuple, tuple[float, float, int]]:
    groups: dict[tuple, list[float]] = {}
    for c in cells:
        groups.setdefault((*run_key(c), c["test"]), []).append(c["accuracy"])
    return {k: (float(np.mean(v)), float(np.std(v)), len(v)) for k, v in groups.items()}


def paper_row(run: tuple) -> dict | None:
    dataset, train, method, parties, _, overrides = run
    return PAPER.get((dataset, train, method)) if parties == PAPER_K else None


def run_order(run: tuple) -> tuple:
    """Tables and figures list runs by dataset, method, training mechanism (the paper's order), K."""
    dataset, train, method, parties, preset, overrides = run
    position = TRAIN_MECHANISMS.index(train) if train in TRAIN_MECHANISMS else len(TRAIN_MECHANISMS)
    return dataset, METHOD_ORDER.index(method), overrides, position, train, parties or 0, preset


def describe(run: tuple) -> str:
    dataset, train, method, parties, preset, overrides = run
    extra = ", ".join(f"{k}={v}" for k, v in json.loads(overrides).items())
    return f"{dataset} {NAMES[method]}, trained {train}, K={parties}, preset {preset}" + (
        f", {extra}" if extra else "")


def observed_row(cells: list[dict], run: tuple) -> list[str]:
    """The mean share of parties that hold a test record under each pattern (where the cells record it): what
    makes a pattern hard, and what the data pipeline changes under MAR (its masks follow the features)."""
    shares = {t: [c["observed"] for c in cells if run_key(c) == run and c["test"] == t and "observed" in c]
              for t in TEST_PATTERNS}
    if not any(shares.values()):
        return []
    return ["| parties observed (%) | " + " | ".join(f"{100 * np.mean(v):.0f}" if v else "-" for v in shares.values())
            + " | | | | |"]


def markdown(cells: list[dict]) -> str:
    """Mean ± std (n seeds) per test pattern, one row per run; the paper's row under ours where known."""
    stats = summarise(cells)
    runs = sorted({k[:-1] for k in stats}, key=run_order)
    lines = []
    for dataset in sorted({r[0] for r in runs}):
        lines += [f"**{dataset}** (accuracy %, mean ± std over seeds; n = seeds)", "",
                  "| run | " + " | ".join(TEST_PATTERNS) + " | mean of 7 | n | wall time per run (s) | stage 1 / "
                  "stage 2 / evaluation (s) |",
                  "|---|" + "---|" * (len(TEST_PATTERNS) + 4)]
        for run in (r for r in runs if r[0] == dataset):
            values = [stats.get((*run, t)) for t in TEST_PATTERNS]
            n = max((v[2] for v in values if v), default=0)
            firsts = [c for c in cells if run_key(c) == run and c["test"] == TEST_PATTERNS[0]]
            stages = [c["stage_time_s"] for c in firsts if "pretrain" in c.get("stage_time_s", {})]
            split = " / ".join(f"{np.mean([t[k] for t in stages]):.0f}" for k in ("pretrain", "train", "evaluate")
                               ) if stages else "-"
            label = describe(run).removeprefix(f"{dataset} ")
            mean = f"{np.mean([v[0] for v in values]):.1f}" if all(values) else "-"
            lines.append(f"| {label} | " + " | ".join(f"{v[0]:.1f} ± {v[1]:.1f}" if v else "-" for v in values)
                         + f" | {mean} | {n} | {np.mean([c['wall_time_s'] for c in firsts]):.0f} | {split} |")
            lines += observed_row(cells, run)
            lines += paper_lines(run, values)
        lines.append("")
    return "\n".join([*lines, *ranking(stats)])


def paper_lines(run: tuple, values: list) -> list[str]:
    """The paper's row under ours, and the difference per pattern and of the seven patterns' means."""
    paper = paper_row(run)
    if not paper:
        return []
    gaps = [values[i][0] - paper[t] if values[i] else None for i, t in enumerate(TEST_PATTERNS)]
    mean_gap = f"{np.mean(gaps):+.1f}" if None not in gaps else "-"
    return ["| paper (mean of 5) | " + " | ".join(f"{paper[t]:.1f}" for t in TEST_PATTERNS)
            + f" | {np.mean(list(paper.values())):.1f} | 5 | | |",
            "| ours − paper | " + " | ".join(f"{g:+.1f}" if g is not None else "-" for g in gaps)
            + f" | {mean_gap} | | | |"]


def ranking(stats: dict[tuple, tuple[float, float, int]]) -> list[str]:
    """The paper's claim, recomputed from what was run: per (dataset, training mechanism, K, preset, overrides)
    with FALSE-VFL and every baseline of the paper, the test patterns on which FALSE-VFL (its better variant)
    is above every baseline (means over seeds), next to the same count from the paper's rows."""
    groups: dict[tuple, dict[str, dict[str, float]]] = {}
    for (dataset, train, method, parties, preset, overrides, test), (mean, _, _) in stats.items():
        groups.setdefault((dataset, train, parties, preset, overrides), {}).setdefault(method, {})[test] = mean
    lines = []
    for (dataset, train, parties, preset, overrides), methods in sorted(groups.items(), key=str):
        ours = _firsts(methods)
        if ours is None:
            continue
        paper = _firsts({m: PAPER[(dataset, train, m)] for m in METHOD_ORDER if (dataset, train, m) in PAPER})
        extra = f", {overrides}" if overrides != "{}" else ""
        lines.append(f"FALSE-VFL above every baseline ({', '.join(ours[2])}; {dataset}, trained {train}, "
                     f"K={parties}, preset {preset}{extra}): on **{ours[0]} of {ours[1]}** test patterns"
                     + (f"; in the paper's rows on {paper[0]} of {paper[1]}" if paper and parties == PAPER_K else "")
                     + ".")
    return [*lines, ""] if lines else []


def _firsts(methods: dict[str, dict[str, float]]) -> tuple[int, int, list[str]] | None:
    """(patterns where FALSE-VFL's better variant beats every baseline, patterns compared, the baselines), or
    None without FALSE-VFL and all four baselines on all seven patterns."""
    ours = [m for m in ("false-vfl-i", "false-vfl-ii") if m in methods]
    baselines = [m for m in METHOD_ORDER if m not in ("false-vfl-i", "false-vfl-ii")]
    if not ours or any(set(methods.get(m, {})) != set(TEST_PATTERNS) for m in [*ours, *baselines]):
        return None
    wins = sum(max(methods[m][t] for m in ours) > max(methods[b][t] for b in baselines) for t in TEST_PATTERNS)
    return wins, len(TEST_PATTERNS), [NAMES[b] for b in baselines]


def plot_grid(cells: list[dict], path: Path) -> None:
    """The paper's figure layout: per (dataset, method, K, overrides) one row of panels, one panel
    per training mechanism, bars per test pattern (mean ± std over seeds), the paper's where known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summarise(cells)
    runs = sorted({k[:-1] for k in stats}, key=run_order)
    rows = list(dict.fromkeys((r[0], r[2], r[3], r[4], r[5]) for r in runs))
    trains = list(dict.fromkeys(r[1] for r in sorted(runs, key=lambda r: run_order(r)[3:5])))
    fig, axes = plt.subplots(len(rows), len(trains), figsize=(3.3 * len(trains), 2.8 * len(rows)), squeeze=False)
    x = np.arange(len(TEST_PATTERNS))
    for i, (dataset, method, parties, preset, overrides) in enumerate(rows):
        for j, train in enumerate(trains):
            ax = axes[i][j]
            run = (dataset, train, method, parties, preset, overrides)
            if (*run, TEST_PATTERNS[0]) not in stats:
                ax.axis("off")
                continue
            means = [stats.get((*run, t), (np.nan, 0, 0))[0] for t in TEST_PATTERNS]
            stds = [stats.get((*run, t), (0, 0, 0))[1] for t in TEST_PATTERNS]
            n = stats[(*run, TEST_PATTERNS[0])][2]
            paper = paper_row(run)
            width = 0.4 if paper else 0.7
            ax.bar(x - (0.2 if paper else 0), means, width, yerr=stds, capsize=2, color="#4c72b0",
                   label=f"ours (n={n})")
            if paper:
                ax.bar(x + 0.2, [paper[t] for t in TEST_PATTERNS], width, color="#dd8452", label="paper")
            ax.set_xticks(x, TEST_PATTERNS, rotation=50, fontsize=6)
            ax.set_ylim(0, 100)
            ax.tick_params(axis="y", labelsize=7)
            ax.set_title(f"{dataset} {NAMES[method]} K={parties}: train {train}", fontsize=7)
            ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_parties(cells: list[dict], path: Path) -> bool:
    """Accuracy against K, each line trained and tested under the same mechanism (the paper's
    ablation); False when fewer than two K were run."""
    stats = summarise(cells)
    series: dict[tuple, list[tuple[int, float, float]]] = {}
    for (dataset, train, method, parties, preset, overrides, test), (mean, std, _) in stats.items():
        if test == train:
            series.setdefault((dataset, train, method, preset, overrides), []).append((parties, mean, std))
    series = {k: sorted(v) for k, v in series.items() if len({p for p, _, _ in v}) >= 2}
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for (dataset, train, method, preset, overrides), points in sorted(series.items(), key=str):
        ks, means, stds = (np.array(v) for v in zip(*points, strict=True))
        extra = "".join(f", {k}={v}" for k, v in json.loads(overrides).items())
        ax.plot(ks, means, marker="o", label=f"{dataset} {NAMES[method]} ({preset}{extra}), train = test = {train}")
        ax.fill_between(ks, means - stds, means + stds, alpha=0.2)
    ax.set_xlabel("number of parties K")
    ax.set_ylabel("test accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_methods(cells: list[dict], path: Path) -> bool:
    """Every method side by side per test pattern (mean ± std over seeds), each method's paper row as black
    markers, one panel per (dataset, training mechanism, K, preset, overrides); False with one method."""
    stats = summarise(cells)
    runs = sorted({k[:-1] for k in stats}, key=run_order)
    panels = list(dict.fromkeys((r[0], r[1], r[3], r[4], r[5]) for r in runs))
    if len({r[2] for r in runs}) < 2:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.4 * len(panels)), squeeze=False)
    x = np.arange(len(TEST_PATTERNS))
    for ax, (dataset, train, parties, preset, overrides) in zip(axes[:, 0], panels, strict=True):
        methods = [r[2] for r in runs if (r[0], r[1], r[3], r[4], r[5]) == (dataset, train, parties, preset, overrides)]
        width = 0.8 / len(methods)
        for i, method in enumerate(methods):
            run = (dataset, train, method, parties, preset, overrides)
            offset = x - 0.4 + width * (i + 0.5)
            means = [stats.get((*run, t), (np.nan, 0, 0))[0] for t in TEST_PATTERNS]
            stds = [stats.get((*run, t), (0, 0, 0))[1] for t in TEST_PATTERNS]
            ax.bar(offset, means, width, yerr=stds, capsize=1.5, label=NAMES[method],
                   color=f"C{METHOD_ORDER.index(method)}")
            paper = paper_row(run)
            if paper:
                ax.plot(offset, [paper[t] for t in TEST_PATTERNS], "k_", markersize=9, markeredgewidth=2,
                        label="paper (mean of 5)" if i == 0 else None)
        ax.set_xticks(x, TEST_PATTERNS, fontsize=8)
        ax.set(ylim=(0, 100), ylabel="test accuracy (%)")
        ax.set_title(f"{dataset}, trained {train}, K={parties}, preset {preset} (black: the paper's row)", fontsize=9)
        ax.legend(fontsize=7, ncol=4, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(cells: list[dict], out: Path, readme: str | None, steps: bool = False) -> None:
    table = markdown(cells) + ("\n" + "\n".join(steps_table(cells)) if steps else "")
    (out / "accuracy.md").write_text(table + "\n")
    plot_grid(cells, out / "accuracy.png")
    has_methods = plot_methods(cells, out / "methods.png")
    has_parties = plot_parties(cells, out / "parties.png")
    print("\n" + table)
    print(f"results: {out / 'accuracy.json'}, {out / 'accuracy.md'}, {out / 'accuracy.png'}"
          + (f" and {out / 'parties.png'}" if has_parties else ""))
    if readme:
        readme_path = Path(readme)
        images = (f"![methods]({relative_link(out / 'methods.png', readme_path)})" if has_methods else
                  f"![accuracy]({relative_link(out / 'accuracy.png', readme_path)})") + (
            f"\n\n![parties]({relative_link(out / 'parties.png', readme_path)})" if has_parties else "")
        update_readme(readme_path, out.resolve().name, f"{table}\n{images}\n")
        print(f"rewrote the results section of {readme_path}")


def quiet(path: str | None) -> bool:
    """True when no run may start now (FILE of --wait-while exists)."""
    return path is not None and Path(path).exists()


def execute(todo: list[tuple[Config, dict]], args):
    """Yield (meta, result or the exception it raised) per run as runs finish: in this process for
    --jobs 1, else in a pool of spawned processes (never fork a process that may hold a CUDA context).
    A run starts only while the --wait-while file is absent; finished runs are reported meanwhile."""
    if args.jobs == 1:
        for cfg, meta in todo:
            while quiet(args.wait_while):
                time.sleep(30)
            try:
                yield meta, run_cell(cfg, args.threads, not args.quiet, args.checkpoints)
            except KeyboardInterrupt:
                raise
            except Exception as error:  # one failed run must not lose the others
                yield meta, error
        return
    queue, pending = list(todo), {}
    with futures.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        while queue or pending:
            while queue and len(pending) < args.jobs and not quiet(args.wait_while):
                cfg, meta = queue.pop(0)
                pending[pool.submit(run_cell, cfg, args.threads, False, args.checkpoints)] = meta
            if not pending:
                time.sleep(30)
                continue
            done, _ = futures.wait(pending, timeout=30, return_when=futures.FIRST_COMPLETED)
            for future in done:
                error = future.exception()
                yield pending.pop(future), error if error is not None else future.result()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.jobs < 1 or (args.threads is not None and args.threads < 1):
        print("error: --jobs and --threads must be at least 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    path = out / "accuracy.json"
    cells: list[dict] = json.loads(path.read_text()) if path.exists() else []
    failures = 0
    if not args.report_only:
        done = {cell_key(c) for c in cells}
        todo = []
        for cfg, overrides in planned_configs(args):
            meta = {"dataset": cfg.dataset, "train": cfg.train_mechanism, "method": method_for(cfg).label,
                    "variant": cfg.options.get("variant", "I"),
                    "seed": cfg.seed, "parties": cfg.parties, "preset": args.preset, "overrides": overrides}
            if cell_key(meta) not in done:
                todo.append((cfg, meta))
        print(f"{len(todo)} runs to do ({len(done)} already in {path})", flush=True)
        started = time.perf_counter()
        for meta, result in execute(todo, args):
            name = f"{meta['dataset']} {meta['method']} {meta['train']} K={meta['parties']} seed {meta['seed']}"
            if isinstance(result, BaseException):
                failures += 1
                print(f"[{time.perf_counter() - started:6.0f} s] {name}: FAILED: {result}", file=sys.stderr, flush=True)
                continue
            for test, acc in result["accuracy"].items():
                cells.append({**meta, "test": test, "accuracy": acc, "observed": result["observed"][test],
                              "wall_time_s": result["wall_time_s"],
                              "stage_time_s": result["stage_time_s"], "final_loss": result["final_loss"],
                              "device": result["device"],
                              "threads": result["threads"]})
            write_json(path, cells)
            print(f"[{time.perf_counter() - started:6.0f} s] {name}: "
                  + " ".join(f"{t}={a:.1f}" for t, a in result["accuracy"].items())
                  + f" ({result['wall_time_s']:.0f} s)", flush=True)
        if failures:
            print(f"error: {failures} runs failed (see above); rerun to retry them", file=sys.stderr)
    if not cells:
        print(f"error: no results in {path}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    report(cells, out, args.readme, args.steps)
    return 1 if not args.report_only and failures else 0


if __name__ == "__main__":
    sys.exit(guarded(main))
