"""A federation on separately held tables reaches the accuracy of the simulation on the same split and mask.

    python bench/federation_equivalence.py --dataset digits --parties 4 --seeds 0 1 2 --protocol mpc --out DIR
        [--preset default] [--test-pattern mcar:0.2] [--readme README.md]

For every seed: `simulate` (local runtime, plain) trains on the simulated split and scores the test pattern;
`federation demo` writes the very same records, labels and mask as per-party tables with string IDs and
shuffled row orders, and `federation train` / `predict` run them through private alignment and the chosen
protocol, one process per party; the predictions are scored against truth.csv. The two differ in their
random numbers (fresh secrets per run, another batch order over the aligned union) and in the per-party
standardisation, not in the data. Writes DIR/equivalence.json (the settings, and the result per seed and
side: a killed run resumes; other settings are refused) and DIR/equivalence.md; `--readme` rewrites the
README section named after DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from readme_section import update_readme  # noqa: E402

from falsevfl_secure.cli import guarded  # noqa: E402
from falsevfl_secure.errors import InputError  # noqa: E402
from falsevfl_secure.fsio import write_json  # noqa: E402
from falsevfl_secure.methods import make_config  # noqa: E402
from falsevfl_secure.transport import PROTOCOLS  # noqa: E402


def simulated(args, seed: int) -> dict:
    from falsevfl_secure.runtime.local import run_local

    cfg = make_config(args.dataset, args.preset, parties=args.parties, seed=seed)
    result = run_local(cfg, (args.test_pattern,), progress=False)
    return {"accuracy": result.accuracy[args.test_pattern], "seconds": result.wall_time_s}


def federated(args, seed: int, folder: Path) -> dict:
    """demo -> train -> predict through the federation's command line; the score against truth.csv."""
    from falsevfl_secure.federation.__main__ import main as federation

    started = time.perf_counter()
    config = str(folder / "federation.toml")
    steps = (["demo", "--dataset", args.dataset, "--parties", str(args.parties), "--out", str(folder), "--seed",
              str(seed), "--protocol", args.protocol, "--test-pattern", args.test_pattern, "--preset", args.preset],
             ["train", "--config", config, "--quiet"],
             ["predict", "--config", config, "--quiet", "--out", str(folder / "predictions.csv")])
    for step in steps[1:] if (folder / "federation.toml").exists() else steps:  # a resumed seed keeps its demo
        with contextlib.redirect_stdout(io.StringIO()):
            if federation(step) != 0:
                raise InputError(f"federation {step[0]} failed for seed {seed} (see the error above)")
    truth = {r["id"]: r["label"] for r in csv.DictReader(open(folder / "truth.csv", newline=""))}
    predicted = {r["id"]: r["prediction"] for r in csv.DictReader(open(folder / "predictions.csv", newline=""))}
    scored = [i for i in truth if predicted.get(i)]
    record = json.loads((folder / "party0" / "model" / "manifest.json").read_text())
    return {"accuracy": 100.0 * sum(predicted[i] == truth[i] for i in scored) / len(scored),
            "seconds": round(time.perf_counter() - started, 1), "scored": len(scored), "protocol": record["protocol"]}


def markdown(cells: list[dict], args) -> str:
    lines = [f"**{args.dataset}**, K = {args.parties}, preset {args.preset}, trained under mcar:0.2, test pattern "
             f"{args.test_pattern}; federation under {args.protocol} (accuracy %)", "",
             "| seed | simulate (plain, local) | federation | difference |", "|---|---|---|---|"]
    pairs = [(c["seed"], c["simulate"]["accuracy"], c["federation"]["accuracy"]) for c in cells
             if "simulate" in c and "federation" in c]
    lines += [f"| {s} | {a:.2f} | {b:.2f} | {b - a:+.2f} |" for s, a, b in pairs]
    if pairs:
        mean_a, mean_b = (statistics.mean(p[i] for p in pairs) for i in (1, 2))
        lines.append(f"| mean | {mean_a:.2f} | {mean_b:.2f} | {mean_b - mean_a:+.2f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--parties", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--preset", default="default")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default="mpc")
    p.add_argument("--test-pattern", default="mcar:0.2")
    p.add_argument("--out", default="runs/federation-equivalence")
    p.add_argument("--readme", default=None)
    return p.parse_args(argv)


SETTINGS = ("dataset", "parties", "preset", "protocol", "test_pattern")


def settings_of(args) -> dict:
    return {name: getattr(args, name) for name in SETTINGS}


def stored_cells(path: Path, args) -> list[dict]:
    """The cells already measured in `path` (none if it does not exist); refuses a file written with other
    settings, naming them, so that a resumed run never mixes presets or protocols in one table."""
    if not path.exists():
        return []
    record = json.loads(path.read_text())
    settings = settings_of(args)
    stored = record.get("settings", {}) if isinstance(record, dict) else {}
    differ = [f"{name} {stored.get(name)!r} (asked: {settings[name]!r})" for name in SETTINGS
              if stored.get(name) != settings[name]]
    if differ:
        raise InputError(f"{path} holds results for other settings: {', '.join(differ)}; use another --out")
    return record["cells"]


def run(args) -> int:
    out = Path(args.out)
    path = out / "equivalence.json"
    cells = stored_cells(path, args)
    for seed in args.seeds:
        cell = next((c for c in cells if c["seed"] == seed), None) or {"seed": seed}
        if cell not in cells:
            cells.append(cell)
        for side, measure in (("simulate", lambda s: simulated(args, s)),
                              ("federation", lambda s: federated(args, s, out / f"seed{s}"))):
            if side not in cell:
                cell[side] = measure(seed)
                write_json(path, {"settings": settings_of(args), "cells": cells})
                print(f"seed {seed} {side}: {cell[side]['accuracy']:.2f} % ({cell[side]['seconds']:.0f} s)", flush=True)
    table = markdown(sorted(cells, key=lambda c: c["seed"]), args)
    (out / "equivalence.md").write_text(table)
    print(table)
    if args.readme:
        update_readme(Path(args.readme), out.resolve().name, table)
    return 0


def main(argv=None) -> int:
    return guarded(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
