"""Each party's own table: a CSV (or Parquet) file with an ID column and the party's feature columns.

The active party's file also has a label column, empty where the record is unlabeled. A row whose
feature cells are ALL empty lists the ID without holding the feature block (the active party knows
a label or wants a prediction for a record whose features it does not hold); a row with only SOME
feature cells empty is refused, because partially missing blocks are not supported.

Every bad input is answered with ONE `DataError` whose message starts with the party and the file
and names the line (1-based, header = line 1) and/or the column, e.g.
`party 'bank', file /x/bank/train.csv, line 17, column 'age': 'abc' is not a number`.
IDs and labels stay strings exactly as written (stripped): "007" is never read as 7.
"""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from .errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")
# Cells converted per numpy batch: bounds memory for wide tables while keeping the conversion vectorised.
_BATCH_CELLS = 200_000
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SHOWN = 8  # at most this many names are listed in a message


@dataclass(frozen=True, eq=False)
class PartyTable:
    """One party's table as read from its file (arrays are read-only).

    `x` holds the features in file order (float32; rows that are not held are 0.0), `held` is False
    where every feature cell was empty, `labels` the raw label cells (None = empty) when a label
    column was requested. `locations[i]` says where row i came from ("line 17"; "row 16" for
    Parquet), for messages that name a row.
    """

    party: str
    path: Path
    ids: tuple[str, ...]
    columns: tuple[str, ...]
    x: np.ndarray
    held: np.ndarray
    labels: tuple[str | None, ...] | None
    locations: tuple[str, ...] = field(default=())

    @property
    def n_rows(self) -> int:
        return len(self.ids)

    @property
    def where(self) -> str:
        """The message prefix naming this table: "party 'bank', file /x/bank/train.csv"."""
        return _Context(self.party, self.path).prefix()


@dataclass(frozen=True)
class _Context:
    """Who and what a message is about; `error` builds the one DataError with the standard prefix."""

    party: str
    path: Path

    def prefix(self, location: str | None = None, column: str | None = None) -> str:
        parts = [f"party {self.party!r}", f"file {self.path}"]
        if location is not None:
            parts.append(location)
        if column is not None:
            parts.append(f"column {column!r}")
        return ", ".join(parts)

    @property
    def header_location(self) -> str | None:
        return None if self.path.suffix.lower() in PARQUET_SUFFIXES else "line 1"

    def error(self, message: str, location: str | None = None, column: str | None = None) -> DataError:
        return DataError(f"{self.prefix(location, column)}: {message}")


@dataclass(frozen=True)
class _Layout:
    """Positions of the ID, label and feature columns in the header."""

    header: tuple[str, ...]
    id_index: int
    label_index: int | None
    feature_index: tuple[int, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.header[i] for i in self.feature_index)


def read_party_table(path: str | Path, party: str, id_column: str, label_column: str | None = None,
                     expected_columns: Sequence[str] | None = None, label_optional: bool = False) -> PartyTable:
    """Read and validate one party's table; every bad input raises one DataError (see module doc).

    `expected_columns` (a saved model's feature columns) must equal the file's feature columns in
    the same order. With `label_optional`, a table without the label column is read without labels
    (a prediction table). Parquet files (`.parquet`, `.pq`) need pyarrow; everything else is read as CSV.
    """
    at = _Context(str(party), Path(path).expanduser().absolute())
    with _open_rows(at) as (header, rows):
        if label_optional and label_column not in header:
            label_column = None
        layout = _layout(header, id_column, label_column, at)
        if expected_columns is not None:
            _check_expected(layout.columns, expected_columns, at)
        builder = _Builder(layout, at)
        batch_rows = max(1, _BATCH_CELLS // len(header))
        for batch in _batches(rows, batch_rows):
            builder.add(batch)
    return builder.finish(label_column is not None)


# ---------------------------------------------------------------------------------------------- reading


@contextlib.contextmanager
def _open_rows(at: _Context) -> Iterator[tuple[tuple[str, ...], Iterator[tuple[str, list[str]]]]]:
    """(header, rows) of the file, each row as (location, cells); a DataError for an unreadable file."""
    if not at.path.exists():
        raise at.error(f"no such file (expected the party's table at {at.path})")
    if not at.path.is_file():
        raise at.error("is not a file (expected a CSV or Parquet table)")
    if at.path.suffix.lower() in PARQUET_SUFFIXES:
        yield _parquet_rows(at)
        return
    try:
        handle = open(at.path, newline="", encoding="utf-8-sig")
    except OSError as error:
        raise at.error(f"cannot open the file ({error.strerror or error})") from None
    with handle:
        rows = _csv_rows(handle, at)
        header = next(rows, None)
        if header is None:
            raise at.error("the file is empty: expected a header line naming the ID and feature columns")
        yield tuple(cell.strip() for cell in header[1]), rows


def _csv_rows(handle, at: _Context) -> Iterator[tuple[str, list[str]]]:
    """Non-blank CSV records with the line each starts on; CSV syntax errors become DataErrors."""
    reader = csv.reader(_lines(handle, at), strict=True)
    end = 0
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise at.error(f"not a readable CSV file ({error})", f"line {reader.line_num}") from None
        start, end = end + 1, reader.line_num
        if cells:  # a blank line is not a record
            yield f"line {start}", cells


def _lines(handle, at: _Context) -> Iterator[str]:
    """The file's text lines; a DataError for a NUL character or bytes that are not UTF-8 (binary files)."""
    try:
        for number, line in enumerate(handle, start=1):
            if "\x00" in line:
                raise at.error("contains a NUL character; is this a CSV text file?", f"line {number}")
            yield line
    except UnicodeDecodeError:
        line = _first_undecodable_line(at.path)
        location = None if line is None else f"line {line}"
        raise at.error("holds bytes that are not UTF-8 text; is this a CSV file?", location) from None


def _first_undecodable_line(path: Path) -> int | None:
    """The first line that is not UTF-8 (text is decoded in blocks, so the decoder cannot say)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return None


def _parquet_rows(at: _Context) -> tuple[tuple[str, ...], Iterator[tuple[str, list[str]]]]:
    """Header and rows of a Parquet file as text cells (null -> empty), located as "row N"."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise at.error("reading Parquet needs pyarrow (pip install pyarrow), or save the table as CSV") from None
    try:
        table = pq.read_table(at.path)
    except Exception as error:  # pyarrow raises its own hierarchy for corrupt files
        raise at.error(f"not a readable Parquet file ({error})") from None
    header = tuple(str(name).strip() for name in table.column_names)
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]

    def text(value) -> str:
        return "" if value is None else repr(value) if isinstance(value, float) else str(value)

    rows = ((f"row {i + 1}", [text(column[i]) for column in columns]) for i in range(table.num_rows))
    return header, rows


def _batches(rows: Iterator[tuple[str, list[str]]], size: int) -> Iterator[list[tuple[str, list[str]]]]:
    batch: list[tuple[str, list[str]]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# ---------------------------------------------------------------------------------------------- header


def _layout(header: tuple[str, ...], id_column: str, label_column: str | None, at: _Context) -> _Layout:
    """Where the ID, label and feature columns are; a DataError for a header that cannot be used."""
    found = _listing(header)
    for position, name in enumerate(header):
        if not name:
            raise at.error(f"header column {position + 1} has no name (columns found: {found})",
                           at.header_location)
        if header.index(name) != position:
            raise at.error(f"column {name!r} appears twice in the header", at.header_location)
    if id_column not in header:
        raise at.error(f"no ID column {id_column!r} (columns found: {found}){_separator_hint(header)}")
    if label_column is not None and label_column == id_column:
        raise at.error(f"the label column and the ID column are both {id_column!r}")
    if label_column is not None and label_column not in header:
        raise at.error(f"no label column {label_column!r} (columns found: {found})")
    skip = {id_column, label_column}
    features = tuple(i for i, name in enumerate(header) if name not in skip)
    if not features:
        raise at.error(f"no feature columns: the header has only {found}")
    label_index = None if label_column is None else header.index(label_column)
    return _Layout(header, header.index(id_column), label_index, features)


def _separator_hint(header: tuple[str, ...]) -> str:
    """A hint when the single header cell looks like another separator (only commas separate cells)."""
    if len(header) == 1:
        for separator, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
            if separator in header[0]:
                return f"; the header looks separated by {name}, but cells must be separated by commas"
    return ""


def _check_expected(columns: tuple[str, ...], expected: Sequence[str], at: _Context) -> None:
    """The file's feature columns must be the saved model's, in the same order."""
    expected = tuple(str(name) for name in expected)
    if columns == expected:
        return
    missing = [name for name in expected if name not in columns]
    unexpected = [name for name in columns if name not in expected]
    if not missing and not unexpected:
        raise at.error(f"the feature columns are the model's but in another order: expected "
                       f"{_listing(expected)}, found {_listing(columns)}")
    parts = []
    if missing:
        parts.append(f"missing {_listing(missing)}")
    if unexpected:
        parts.append(f"unexpected {_listing(unexpected)}")
    raise at.error(f"the feature columns differ from the model's: {'; '.join(parts)}")


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


# ---------------------------------------------------------------------------------------------- rows


class _Builder:
    """Accumulates validated batches of rows (IDs, labels, feature values) in file order."""

    def __init__(self, layout: _Layout, at: _Context) -> None:
        self.layout, self.at = layout, at
        self.first_seen: dict[str, str] = {}  # ID -> location of its row, to name both duplicates
        self.locations: list[str] = []
        self.labels: list[str | None] = []
        self.values: list[np.ndarray] = []
        self.held: list[np.ndarray] = []

    def add(self, batch: list[tuple[str, list[str]]]) -> None:
        width = len(self.layout.header)
        for location, cells in batch:
            if len(cells) != width:
                cells_text = "1 cell" if len(cells) == 1 else f"{len(cells)} cells"
                raise self.at.error(f"has {cells_text}, but the header (line 1) has {width} columns", location)
            self._add_id(cells[self.layout.id_index].strip(), location)
            if self.layout.label_index is not None:
                self.labels.append(cells[self.layout.label_index].strip() or None)
        features = [[cells[i] for i in self.layout.feature_index] for _, cells in batch]
        values, held = _parse_features(features, [location for location, _ in batch], self.layout.columns, self.at)
        self.values.append(values)
        self.held.append(held)

    def _add_id(self, identifier: str, location: str) -> None:
        column = self.layout.header[self.layout.id_index]
        if not identifier:
            raise self.at.error("the ID cell is empty", location, column)
        previous = self.first_seen.setdefault(identifier, location)
        if previous != location:
            raise self.at.error(f"ID {identifier!r} appears twice in this table ({previous} and {location})",
                                location, column)
        self.locations.append(location)

    def finish(self, with_labels: bool) -> PartyTable:
        if not self.locations:
            raise self.at.error("the table has a header but no rows")
        x = np.concatenate(self.values)
        held = np.concatenate(self.held)
        x.flags.writeable = False
        held.flags.writeable = False
        return PartyTable(self.at.party, self.at.path, tuple(self.first_seen), self.layout.columns, x, held,
                          tuple(self.labels) if with_labels else None, tuple(self.locations))


def _parse_features(rows: list[list[str]], locations: list[str], columns: tuple[str, ...],
                    at: _Context) -> tuple[np.ndarray, np.ndarray]:
    """float32 values and the held mask of a batch; a DataError names the first bad cell in file order."""
    cells = np.char.strip(np.array(rows, dtype=str).reshape(len(rows), len(columns)))
    empty = cells == ""
    n_empty = empty.sum(axis=1)
    partial = np.flatnonzero((n_empty > 0) & (n_empty < len(columns)))
    if partial.size:
        row = int(partial[0])
        blank = [columns[j] for j in np.flatnonzero(empty[row])]
        raise at.error(f"some but not all feature cells are empty (empty: {_listing(blank)}); a row must hold "
                       "all of the party's features or none (partially missing blocks are not supported)",
                       locations[row])
    filled = np.where(empty, "0", cells)
    try:
        values = filled.astype(np.float64)
    except ValueError:
        row, column = _first_unparsable(filled)
        raise at.error(f"{str(filled[row, column])!r} is not a number", locations[row], columns[column]) from None
    bad = ~np.isfinite(values) | (np.abs(values) > _FLOAT32_MAX)
    if bad.any():
        row, column = (int(v) for v in np.argwhere(bad)[0])
        text = str(filled[row, column])
        reason = "is not a finite number" if not math.isfinite(values[row, column]) else \
            f"is too large (features are stored as float32, at most {_FLOAT32_MAX:.4g} in magnitude)"
        raise at.error(f"{text!r} {reason}", locations[row], columns[column])
    return values.astype(np.float32), n_empty == 0


def _first_unparsable(cells: np.ndarray) -> tuple[int, int]:
    """(row, column) of the first cell, in file order, that is not a number."""
    for row in range(cells.shape[0]):
        for column in range(cells.shape[1]):
            try:
                float(cells[row, column])
            except ValueError:
                return row, column
    raise AssertionError("unreachable: numpy refused a batch whose every cell float() accepts")


# ---------------------------------------------------------------------------------------------- labels


def encode_labels(labels: Sequence[str | None], classes: Sequence[str] | None,
                  task: Literal["classification", "regression"], where: str,
                  locations: Sequence[str] | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Labels as model targets: `(indices, classes)` or `(values, ())`.

    Classification: int64 class indices, -1 where unlabeled; `classes` None derives them from the
    labels (sorted, numbers by value before other text) and needs at least two; a given class list
    refuses "a label the model never saw". Regression: float64 values, NaN where unlabeled; a
    non-numeric or non-finite label is refused. `where` prefixes messages (e.g. `PartyTable.where`);
    `locations` name the rows (`PartyTable.locations`), else "row i" (1-based).
    """
    if task not in ("classification", "regression"):
        raise DataError(f"{where}: task must be 'classification' or 'regression', got {task!r}")
    labels = list(labels)
    locations = _label_locations(labels, locations, where)
    for position, label in enumerate(labels):
        if label is not None and not isinstance(label, str):
            raise DataError(f"{where}, {locations[position]}: a label must be text or None, got {label!r}")
    if task == "regression":
        if classes is not None:
            raise DataError(f"{where}: a class list applies only to classification, not regression")
        return _regression_targets(labels, locations, where), ()
    return _classification_targets(labels, classes, locations, where)


def _label_locations(labels: list, locations: Sequence[str] | None, where: str) -> list[str]:
    if locations is None or len(locations) == 0:
        return [f"row {i + 1}" for i in range(len(labels))]
    if len(locations) != len(labels):
        raise DataError(f"{where}: {len(locations)} row locations for {len(labels)} labels")
    return [str(location) for location in locations]


def _classification_targets(labels: list[str | None], classes: Sequence[str] | None, locations: list[str],
                            where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    if classes is None:
        known = tuple(sorted({label for label in labels if label is not None}, key=_label_order))
        if len(known) < 2:
            raise DataError(f"{where}: classification needs at least two classes among the labels, "
                            f"found {len(known)}{': ' + repr(known[0]) if known else ''}")
    else:
        known = tuple(classes)
        if not known or not all(isinstance(c, str) and c for c in known) or len(set(known)) != len(known):
            raise DataError(f"{where}: the class list must be distinct non-empty texts, got {_listing(known)}")
    index = {name: i for i, name in enumerate(known)}
    out = np.full(len(labels), -1, dtype=np.int64)
    for position, label in enumerate(labels):
        if label is None:
            continue
        if label not in index:
            raise DataError(f"{where}, {locations[position]}: {label!r} is a label the model never saw "
                            f"(classes: {_listing(known)})")
        out[position] = index[label]
    return out, known


def _label_order(label: str) -> tuple[int, float, str]:
    """Sort key: numeric labels by value ("2" before "10"), then other text alphabetically."""
    try:
        value = float(label)
    except ValueError:
        return (1, 0.0, label)
    return (0, value, label) if math.isfinite(value) else (1, 0.0, label)


def _regression_targets(labels: list[str | None], locations: list[str], where: str) -> np.ndarray:
    out = np.full(len(labels), np.nan, dtype=np.float64)
    for position, label in enumerate(labels):
        if label is None:
            continue
        try:
            value = float(label)
        except ValueError:
            raise DataError(f"{where}, {locations[position]}: label {label!r} is not a number "
                            "(regression needs numeric labels)") from None
        if not math.isfinite(value):
            raise DataError(f"{where}, {locations[position]}: label {label!r} is not a finite number")
        out[position] = value
    return out
