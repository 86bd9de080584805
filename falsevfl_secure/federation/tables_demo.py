"""`federation demo --dataset breast-cancer|wine|diabetes`: tables as a new user's would look.

scikit-learn's breast cancer, wine and diabetes data split across parties: string IDs, each party's rows
in its own shuffled order, partly overlapping ID sets, most records unlabeled, the real column names and,
optionally, messy cells (BOM, CRLF, spaces around cells, `NA`/`nan`/`NULL` tokens), cells missing inside
held rows, text categories (a `smoker` yes/no column at the active party, a `region` at the next party)
and IDs written differently at each party (`0004217`, `4217`, `MRN-004217`, `mrn-004217`; the
`id_pattern` that makes them meet is `MIXED_PATTERN`).

`write_federation(folder, Spec(...))` writes one folder per party (train.csv, predict.csv), truth.csv
(id, label of every prediction record, as the active party writes its IDs) and federation.toml, and
returns what it wrote (so tests can compare against independent truth). The draws use the public seed:
the data are public, nothing here is secret.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..fsio import atomic_write
from ..randomness import PublicStream, public_rng

NAMES = ("clinic", "lab", "insurer", "pharmacy")
# How each party writes record 4217 when the IDs are written differently ("mixed").
ID_FORMATS = {"plain": ("R{:05d}",) * 4, "mixed": ("{:07d}", "{:d}", "MRN-{:06d}", "mrn-{:06d}")}
MIXED_PATTERN = "0*(\\d+)$"  # the key of every mixed format: the digits after the leading zeros


@dataclass(frozen=True)
class Spec:
    dataset: str = "breast-cancer"  # breast-cancer | wine | diabetes
    parties: int = 3
    seed: int = 0
    labeled: float = 0.3  # share of the active party's training records with a label
    held: float = 0.85  # share of the training records each passive party holds
    test: float = 0.25
    missing: float = 0.0  # share of cells removed at random inside held rows
    categorical: bool = False  # add text columns (smoker yes/no at the active party, a region at party 1)
    ids: str = "plain"  # plain | mixed
    messy: bool = True  # BOM, CRLF, spaces around cells, NA tokens for missing cells
    active_columns: int | None = None  # how many columns the active party holds (default: an equal share)
    extra: dict = field(default_factory=dict)  # [federation] settings added to the file
    model: str = 'preset = "quick"\n'
    protocol: str = "plain"
    port: int = 29611


@dataclass
class Written:
    path: Path  # federation.toml
    names: list[str]
    columns: dict[str, list[str]]  # party -> its feature columns
    train_rows: dict[str, np.ndarray]  # party -> record numbers in its training table
    truth: dict[str, str]  # prediction ID (active party's format) -> label text
    task: str


DEMO_TABLES = ("breast-cancer", "wine", "diabetes")


def load(dataset: str) -> tuple[np.ndarray, np.ndarray, list[str], str]:
    """Features, labels (class names, or numbers for diabetes), column names and task of a dataset."""
    from sklearn import datasets

    dataset = dataset.replace("-", "_")
    loader = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine,
              "diabetes": datasets.load_diabetes}[dataset]
    bunch = loader()
    names = [str(n).replace(" ", "_") for n in bunch.feature_names]
    task = "regression" if dataset == "diabetes" else "classification"
    y = bunch.target if task == "regression" else np.asarray(bunch.target_names)[bunch.target]
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(y), names, task


def write_federation(folder: Path, spec: Spec) -> Written:
    x, y, columns, task = load(spec.dataset)
    rng = public_rng(spec.seed, PublicStream.TABLES_DEMO)
    n = len(y)
    order = rng.permutation(n)
    test = order[:int(spec.test * n)]
    train = order[int(spec.test * n):]
    blocks = _column_blocks(len(columns), spec, rng)
    names = list(NAMES[:spec.parties])
    written = Written(folder / "federation.toml", names, {}, {}, {}, task)
    labeled = set(rng.choice(train, size=int(spec.labeled * train.size), replace=False).tolist())
    for k, name in enumerate(names):
        block = [columns[j] for j in blocks[k]]
        values = x[:, blocks[k]]
        text = _categories(x, rng, k) if spec.categorical and k < 2 else {}
        if k == 0:
            held = train
        else:
            held = rng.choice(train, size=int(spec.held * train.size), replace=False)
        rows = np.union1d(held, sorted(labeled)) if k == 0 else np.sort(held)
        written.columns[name] = [*block, *text]
        written.train_rows[name] = rows
        label = (lambda i: _label(y[i], task) if i in labeled else "") if k == 0 else None
        _write(folder / name / "train.csv", spec, k, rows, set(held.tolist()), block, values, text, label, rng)
        test_rows = test if k == 0 else rng.choice(test, size=int(0.9 * test.size), replace=False)
        _write(folder / name / "predict.csv", spec, k, np.sort(test_rows), set(test_rows.tolist()), block, values,
               text, None, rng)
    written.truth = {_id(spec, 0, i): _label(y[i], task) for i in test}
    _write_text(folder / "truth.csv", _csv([["id", "label"], *written.truth.items()]))
    from .demo import write_identities

    _write_text(written.path, _toml(spec, names, task, write_identities(folder, names)))
    return written


def _column_blocks(d: int, spec: Spec, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(d)
    first = spec.active_columns or d // spec.parties
    rest = np.array_split(order[first:], spec.parties - 1)
    return [order[:first], *rest]


def _categories(x: np.ndarray, rng: np.random.Generator, k: int) -> dict[str, np.ndarray]:
    """Text columns that carry signal: a yes/no flag from the first feature's median (party 0) or a region
    from the second feature's terciles (party 1), each with 10 % of the values flipped at random."""
    if k == 0:
        values = np.where(x[:, 0] > np.median(x[:, 0]), "yes", "no")
        flip = rng.random(len(values)) < 0.1
        values[flip] = np.where(values[flip] == "yes", "no", "yes")
        return {"smoker": values}
    cuts = np.quantile(x[:, 1], [1 / 3, 2 / 3])
    regions = np.array(["north", "south", "east"])[np.searchsorted(cuts, x[:, 1])]
    return {"region": regions}


def _label(value, task: str) -> str:
    return f"{float(value):g}" if task == "regression" else str(value)


def _id(spec: Spec, k: int, record: int) -> str:
    return ID_FORMATS[spec.ids][k].format(record + 4200)


def _write(path: Path, spec: Spec, k: int, rows: np.ndarray, held: set, block: list[str], values: np.ndarray,
           text: dict, label, rng: np.random.Generator) -> None:
    """One party's table, rows shuffled; cells removed at random inside held rows; messy if asked."""
    header = ["patient_id", *block, *text, *(["outcome"] if label else [])]
    lines = [header]
    tokens = ["NA", "", " nan ", "NULL"] if spec.messy else [""]
    for i in rows[rng.permutation(rows.size)]:
        cells = [f"{v:.6g}" for v in values[i]] + [str(t[i]) for t in text.values()]
        if i not in held:
            cells = [""] * len(cells)
        elif spec.missing:
            gone = rng.random(len(cells)) < spec.missing
            gone[rng.integers(len(cells))] = False  # keep the row held
            cells = [tokens[rng.integers(len(tokens))] if g else c for c, g in zip(cells, gone, strict=True)]
        if spec.messy:
            cells = [f" {c} " if c and rng.random() < 0.1 else c for c in cells]
        identifier = _id(spec, k, i)
        lines.append([f"  {identifier} " if spec.messy and rng.random() < 0.1 else identifier, *cells,
                      *([label(i)] if label else [])])
    text_out = _csv(lines)
    if spec.messy:
        text_out = "\ufeff" + text_out.replace("\n", "\r\n")
    _write_text(path, text_out)


def _csv(rows) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, text.encode("utf-8"))


def _toml(spec: Spec, names: list[str], task: str, pins: dict[str, str]) -> str:
    extra = "".join(f"{k} = {_value(v)}\n" for k, v in spec.extra.items())
    if spec.ids == "mixed" and "id_pattern" not in spec.extra:
        extra += (f"# The parties write their IDs differently: training stops until a rule makes them meet, e.g.\n"
                  f"# id_pattern = {_value(MIXED_PATTERN)}\n")
    parties = "".join(f'\n[[party]]\nname = "{n}"\ntrain = "{n}/train.csv"\npredict = "{n}/predict.csv"\n'
                      f'model = "{n}/model"\nkey = "{pins[n]}"\n' for n in names)
    return ("# One operator plays every role here; with one host per party, each party's own file names only\n"
            "# its own paths (docs/federation-examples.md). Every key: docs/federation-toml.md.\n"
            f'[federation]\nactive = "{names[0]}"\nprotocol = "{spec.protocol}"\nid_column = "patient_id"\n'
            f'label_column = "outcome"\ntask = "{task}"\nrendezvous = "127.0.0.1:{spec.port}"\n{extra}\n'
            f'[model]\n{spec.model}{parties}\n[aggregator]\naddress = "127.0.0.1:{spec.port + 1}"\n'
            f'key = "{pins["aggregator"]}"\n')


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_value(i) for i in v) + "]"
    return repr(v)
