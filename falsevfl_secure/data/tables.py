"""Each party's own table: a CSV (or Parquet) file with an ID column and the party's feature columns.

The active party's file also has a label column, empty where the record is unlabeled.

Missing cells. A cell is missing when it is empty or, after stripping spaces, equals one of the missing
tokens case-insensitively (default `NA`, `nan`, `null`; `[federation] missing_values`). A row may hold
some cells and miss others: `observed` marks the cells present. A row whose feature cells are ALL
missing lists the ID without holding the feature block (`held` is False): the active party knows a label
or wants a prediction for a record whose features it does not hold. Missing label cells are unlabeled.

Column types. A column whose non-missing cells are all numbers is numeric; a column whose non-missing
cells are all text (not numbers) is categorical; a column mixing both is refused (naming one cell of
each) unless it is listed in `categorical`, which makes every value of it a category (`"1"` and `"01"`
are two categories). With `detect_categories=False` (a prediction table read against a saved model)
only the listed columns are categorical and every other cell must be a number.

IDs. `ids` are the keys after the federation's `IdRule` (data/ids.py); `raw_ids` the cells as written
(stripped): "007" is never read as 7. Two rows with one key are refused, naming both lines.

Every bad input is answered with ONE `DataError` whose message starts with the party and the file
and names the line (1-based, header = line 1) and/or the column, e.g.
`party 'bank', file /x/bank/train.csv, line 17, column 'age': 'abc' is not a number`.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import did_you_mean
from .errors import DataError
from .ids import IdRule

PARQUET_SUFFIXES = (".parquet", ".pq")
DEFAULT_MISSING = ("NA", "nan", "null")  # besides the empty cell, which is always missing
# Cells converted per numpy batch: bounds memory for wide tables while keeping the conversion vectorised.
_BATCH_CELLS = 200_000
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True, eq=False)
class PartyTable:
    """One party's table as read from its file (arrays are read-only).

    `x` holds the numeric cells in column order (float32; NaN where a cell is missing and in every
    cell of a categorical column), `text` the cells of each categorical column (None = missing),
    `held` is False where every feature cell is missing, `labels` the raw label cells (None = empty
    or a missing token) when a label column was requested. `ids` are the normalised keys, `raw_ids`
    the IDs as written. `locations[i]` says where row i came from ("line 17"; "row 16" for Parquet).
    """

    party: str
    path: Path
    ids: tuple[str, ...]
    columns: tuple[str, ...]
    x: np.ndarray
    held: np.ndarray
    labels: tuple[str | None, ...] | None
    locations: tuple[str, ...] = field(default=())
    text: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)
    raw_ids: tuple[str, ...] = field(default=())

    @property
    def n_rows(self) -> int:
        return len(self.ids)

    @property
    def where(self) -> str:
        """The message prefix naming this table: "party 'bank', file /x/bank/train.csv"."""
        return _Context(self.party, self.path).prefix()

    @property
    def categorical(self) -> tuple[str, ...]:
        """The categorical columns, in column order."""
        return tuple(name for name in self.columns if name in self.text)

    @property
    def observed(self) -> np.ndarray:
        """(n_rows, n_columns) bool: which feature cells are present."""
        out = ~np.isnan(self.x)
        for name, cells in self.text.items():
            out[:, self.columns.index(name)] = [cell is not None for cell in cells]
        return out


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


@dataclass(frozen=True)
class ReadOptions:
    """How cells are read: the missing tokens, the columns listed as categorical, whether other text
    columns become categorical, and the ID rule."""

    missing_values: tuple[str, ...] = DEFAULT_MISSING
    categorical: tuple[str, ...] = ()
    detect_categories: bool = True
    id_rule: IdRule = field(default_factory=IdRule)

    @property
    def tokens(self) -> frozenset[str]:
        return frozenset(token.strip().lower() for token in self.missing_values) | {""}


def read_party_table(path: str | Path, party: str, id_column: str, label_column: str | None = None,
                     expected_columns: Sequence[str] | None = None, label_optional: bool = False,
                     options: ReadOptions | None = None) -> PartyTable:
    """Read and validate one party's table; every bad input raises one DataError (see module doc).

    `expected_columns` (a saved model's feature columns) must be the file's feature columns, in any
    order: the table's columns come back in the expected order, and missing or extra columns are
    named. With `label_optional`, a table without the label column is read without labels (a
    prediction table). Parquet files (`.parquet`, `.pq`) need pyarrow; everything else is read as CSV.
    """
    options = options or ReadOptions()
    at = _Context(str(party), Path(path).expanduser().absolute())
    with _open_rows(at) as (header, rows):
        if label_optional and label_column not in header:
            label_column = None
        layout = _layout(header, id_column, label_column, at, expected_columns)
        _check_categorical(layout, options.categorical, at)
        builder = _Builder(layout, at, options)
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
            if reader.line_num > end + 1:  # one record over many lines: a trial's unclosed quote, named 4,133 lines on
                raise at.error(f"a quoted cell starting on this line runs on to line {reader.line_num} ({error}): is "
                               "its closing quote (\") missing?", f"line {end + 1}") from None
            raise at.error(f"not a readable CSV file ({error})", f"line {reader.line_num}") from None
        start, end = end + 1, reader.line_num
        if cells:  # a blank line is not a record
            yield f"line {start}", cells


def _lines(handle, at: _Context) -> Iterator[str]:
    """The file's text lines; a DataError for a NUL character or bytes that are not UTF-8 (binary files)."""
    try:
        for number, line in enumerate(handle, start=1):
            if "\x00" in line:
                _refuse_spreadsheet(at)
                raise at.error("contains a NUL character; is this a CSV text file?", f"line {number}")
            yield line
    except UnicodeDecodeError:
        _refuse_spreadsheet(at)
        line = _first_undecodable_line(at.path)
        location = None if line is None else f"line {line}"
        raise at.error("holds bytes that are not UTF-8 text; is this a CSV file?", location) from None


def _refuse_spreadsheet(at: _Context) -> None:
    """A binary file that starts as a spreadsheet does is named as one (a trial: an Excel file renamed .csv read as
    "not UTF-8 text")."""
    with open(at.path, "rb") as raw:
        start = raw.read(8)
    kind = next((name for magic, name in _SPREADSHEETS if start.startswith(magic)), None)
    if kind is not None:
        raise at.error(f"is {kind}, not CSV text: save it as CSV (UTF-8) from the spreadsheet program")


_SPREADSHEETS = ((b"PK\x03\x04", "a zip archive (an Excel .xlsx or OpenDocument spreadsheet?)"),
                 (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an Excel .xls workbook"))


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


def _layout(header: tuple[str, ...], id_column: str, label_column: str | None, at: _Context,
            expected: Sequence[str] | None = None) -> _Layout:
    """Where the ID, label and feature columns are; a DataError for a header that cannot be used."""
    found = _listing(header)
    for position, name in enumerate(header):
        if not name:
            raise at.error(f"header column {position + 1} has no name (columns found: {found})",
                           at.header_location)
        if header.index(name) != position:
            raise at.error(f"column {name!r} appears twice in the header", at.header_location)
    if id_column not in header:
        raise at.error(f"no ID column {id_column!r}{did_you_mean(id_column, header)}{_separator_hint(header)} "
                       f"(columns found: {found})")
    if label_column is not None and label_column == id_column:
        raise at.error(f"the label column and the ID column are both {id_column!r}")
    if label_column is not None and label_column not in header:
        raise at.error(f"no label column {label_column!r}{did_you_mean(label_column, header)} (columns found: {found})")
    skip = {id_column, label_column}
    features = tuple(i for i, name in enumerate(header) if name not in skip)
    if not features:
        raise at.error(f"no feature columns: the header has only {found}")
    if expected is not None:
        features = _expected_order(tuple(header[i] for i in features), expected, at, header)
    label_index = None if label_column is None else header.index(label_column)
    return _Layout(header, header.index(id_column), label_index, features)


def _separator_hint(header: tuple[str, ...]) -> str:
    """A hint when the single header cell looks like another separator (only commas separate cells)."""
    if len(header) == 1:
        for separator, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
            if separator in header[0]:
                return f"; the header looks separated by {name}, but cells must be separated by commas"
    return ""


def _expected_order(columns: tuple[str, ...], expected: Sequence[str], at: _Context,
                    header: tuple[str, ...]) -> tuple[int, ...]:
    """The header positions of the saved model's columns, in the model's order (the file may list them in
    any order); a DataError names every missing and every extra column."""
    expected = tuple(str(name) for name in expected)
    missing = [name for name in expected if name not in columns]
    extra = [name for name in columns if name not in expected]
    if missing or extra:
        parts = [f"missing {_listing(missing)}"] if missing else []
        parts += [f"extra {_listing(extra)}"] if extra else []
        raise at.error(f"the feature columns differ from the training table's: {'; '.join(parts)} "
                       f"(the training table's, which the model reads: {_listing(expected)})", at.header_location)
    return tuple(header.index(name) for name in expected)


def _check_categorical(layout: _Layout, categorical: Sequence[str], at: _Context) -> None:
    """Every column listed as categorical must be one of the table's feature columns."""
    for name in categorical:
        if name not in layout.columns:
            what = "the ID or label column" if name in layout.header else "not a column of the table"
            hint = did_you_mean(name, layout.columns) if name not in layout.header else ""
            raise at.error(f"column {name!r} is listed as categorical but is {what}{hint} "
                           f"(feature columns: {_listing(layout.columns)})")


def _listing(names: Sequence[str]) -> str:
    """Every name, quoted (messages are never cut)."""
    return ", ".join(repr(name) for name in names)


# ---------------------------------------------------------------------------------------------- rows


class _Builder:
    """Accumulates validated batches of rows (IDs, labels, feature cells) in file order."""

    def __init__(self, layout: _Layout, at: _Context, options: ReadOptions) -> None:
        self.layout, self.at, self.options = layout, at, options
        self.tokens = options.tokens
        self.first_seen: dict[str, tuple[str, str]] = {}  # key -> (raw ID, location), to name both rows
        self.raw_ids: list[str] = []
        self.locations: list[str] = []
        self.labels: list[str | None] = []
        self.cells = _Cells(layout.columns, options, at)

    def add(self, batch: list[tuple[str, list[str]]]) -> None:
        width = len(self.layout.header)
        for location, cells in batch:
            if len(cells) != width:
                cells_text = "1 cell" if len(cells) == 1 else f"{len(cells)} cells"
                raise self.at.error(f"has {cells_text}, but the header (line 1) has {width} columns", location)
            self._add_id(cells[self.layout.id_index].strip(), location)
            if self.layout.label_index is not None:
                label = cells[self.layout.label_index].strip()
                self.labels.append(None if label.lower() in self.tokens else label)
        features = np.array([[cells[i] for i in self.layout.feature_index] for _, cells in batch], dtype=str)
        features = np.char.strip(features.reshape(len(batch), len(self.layout.feature_index)))
        self.cells.add(features, [location for location, _ in batch])

    def _add_id(self, identifier: str, location: str) -> None:
        column = self.layout.header[self.layout.id_index]
        if not identifier:
            raise self.at.error("the ID cell is empty", location, column)
        try:
            key = self.options.id_rule.key(identifier)
        except DataError as error:
            raise self.at.error(str(error), location, column) from None
        raw, previous = self.first_seen.setdefault(key, (identifier, location))
        if previous != location:
            if raw == identifier:
                raise self.at.error(f"ID {identifier!r} appears twice in this table ({previous} and {location})",
                                    location, column)
            raise self.at.error(f"IDs {raw!r} ({previous}) and {identifier!r} ({location}) both normalise to "
                                f"{key!r} ({self.options.id_rule.describe()})", location, column)
        self.raw_ids.append(identifier)
        self.locations.append(location)

    def finish(self, with_labels: bool) -> PartyTable:
        if not self.locations:
            raise self.at.error("the table has a header but no rows")
        x, text = self.cells.finish()
        table = PartyTable(self.at.party, self.at.path, tuple(self.first_seen), self.layout.columns, x,
                           np.zeros(0, dtype=bool), tuple(self.labels) if with_labels else None,
                           tuple(self.locations), text, tuple(self.raw_ids))
        held = table.observed.any(axis=1)
        held.flags.writeable = False
        object.__setattr__(table, "held", held)
        return table


class _Cells:
    """The feature cells of the batches read so far: numbers in one float32 matrix, text per column, and
    each column's kind as far as the cells seen decide it."""

    def __init__(self, columns: tuple[str, ...], options: ReadOptions, at: _Context) -> None:
        self.columns, self.at, self.detect = columns, at, options.detect_categories
        self.listed = {columns.index(name) for name in options.categorical}
        self.tokens = sorted(options.tokens)
        self.spellings = _spellings(self.tokens)
        self.kind: dict[int, tuple[str, str, str]] = {}  # column -> (kind, first cell, its location)
        self.numbers: list[np.ndarray] = []
        self.text: dict[int, list[tuple[int, list[str | None]]]] = {}  # column -> (first row, cells)
        self.rows = 0

    def add(self, cells: np.ndarray, locations: list[str]) -> None:
        numeric = [j for j in range(cells.shape[1]) if j not in self.listed and self._kind(j) != "text"]
        parsed = self._numbers(_columns(cells, numeric))
        if parsed is None:  # some column holds text: find which, in file order
            texts = self._text_columns(numeric, cells, locations)
            numeric = [j for j in numeric if j not in texts]
            parsed = self._numbers(_columns(cells, numeric))
        if len(numeric) == cells.shape[1]:
            out = self._checked(*parsed, numeric, cells, locations)
        else:
            out = np.full(cells.shape, np.nan, dtype=np.float32)
            out[:, numeric] = self._checked(*parsed, numeric, cells, locations)
        for j in sorted(set(range(cells.shape[1])) - set(numeric)):
            missing = self._missing(cells[:, j])
            if j not in self.listed:
                self._still_text(j, cells[:, j], missing, locations)
            self.text.setdefault(j, []).append((self.rows, _text_cells(cells[:, j], missing)))
        self.numbers.append(out)
        self.rows += cells.shape[0]

    def _missing(self, cells: np.ndarray) -> np.ndarray:
        """Which cells are missing: empty, or a missing token whatever its case."""
        if self.spellings is not None:  # comparing with every spelling avoids lower-casing every cell
            return np.isin(cells, self.spellings)
        return (cells == "") | np.isin(np.char.lower(cells), self.tokens)

    def _numbers(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(float64 values, missing) when every cell is a number or missing, else None."""
        missing = self._missing(cells)
        try:
            values = np.where(missing, "nan", cells).astype(np.float64)
        except ValueError:
            return None
        return values, missing

    def _kind(self, j: int) -> str | None:
        return self.kind[j][0] if j in self.kind else None

    def _text_columns(self, numeric: list[int], cells: np.ndarray, locations: list[str]) -> set[int]:
        """The columns (numbers so far) that hold text in this batch; a DataError names the first cell in
        file order that may not be text (any, when categories are not detected; else one of a mixed column)."""
        first_text = {}
        for j in numeric:
            if self._numbers(cells[:, [j]]) is not None:
                continue
            present = ~self._missing(cells[:, j])
            numbers = np.zeros(present.shape, dtype=bool)
            numbers[present] = _parses(cells[present, j])
            text = present & ~numbers
            first_text[j] = (int(np.argmax(text)), numbers, int(text.sum()))
        for j in sorted(first_text, key=lambda c: (first_text[c][0], c)):
            row, numbers, texts = first_text[j]
            if not self.detect:  # (a trial's "refused" in a prediction table got no hint)
                raise self.at.error(f"{str(cells[row, j])!r} is not a number (the column is numeric; a word that "
                                    "marks an empty cell goes in [federation] missing_values)", locations[row],
                                    self.columns[j])
            seen = [(texts, row, "text")] + ([(int(numbers.sum()), int(np.argmax(numbers)), "number")]
                                              if numbers.any() else [])
            for _, at, kind in sorted(seen, key=lambda s: (-s[0], s[1])):  # named at the rarer kind, else the later
                self._saw(j, kind, cells[at, j], locations[at])
        return set(first_text)

    def _still_text(self, j: int, cells: np.ndarray, missing: np.ndarray, locations: list[str]) -> None:
        """A text column stays text: a number among its cells is refused (a column mixing both)."""
        present = np.flatnonzero(~missing)
        numeric = _parses(cells[present]) if present.size else np.zeros(0, dtype=bool)
        if numeric.any():
            number = present[int(np.argmax(numeric))]
            self._saw(j, "number", cells[number], locations[number])

    def _saw(self, j: int, kind: str, cell: str, location: str) -> None:
        """Record column j's kind; a column holding both numbers and text is refused at this cell (the
        odd one: the later or the rarer kind), naming one cell of each kind."""
        if kind == "text" and _DECIMAL_COMMA.fullmatch(str(cell)):
            raise self.at.error(f"{str(cell)!r} looks like a number written with a decimal comma; write numbers with "
                                "a decimal point (1.5), or list the column as categorical if its values are "
                                "categories", location, self.columns[j])
        known = self.kind.setdefault(j, (kind, str(cell), location))
        if known[0] != kind:
            (text, text_at), (number, number_at) = sorted([known[1:], (str(cell), location)],
                                                          key=lambda c: _is_number(c[0]))
            raise self.at.error(
                f"the column mixes numbers and text: {text!r} ({text_at}) is not a number, but {number!r} "
                f"({number_at}) is; list the column as categorical (the party's `categorical = [...]`) to treat every "
                f"value as a category, or add "
                f"{text!r} to the missing values if it marks an empty cell", location, self.columns[j])

    def _checked(self, values: np.ndarray, missing: np.ndarray, numeric: list[int], cells: np.ndarray,
                 locations: list[str]) -> np.ndarray:
        """float32 values of the numeric columns; the first non-finite or too large cell is refused."""
        present = ~missing
        bad = present & (~np.isfinite(values) | (np.abs(values) > _FLOAT32_MAX))
        if bad.any():
            row, k = (int(v) for v in np.argwhere(bad)[0])
            cell, j = str(cells[row, numeric[k]]), numeric[k]
            reason = "is not a finite number" if not math.isfinite(values[row, k]) else \
                f"is too large (features are stored as float32, at most {_FLOAT32_MAX:.4g} in magnitude)"
            raise self.at.error(f"{cell!r} {reason}", locations[row], self.columns[j])
        for k in np.flatnonzero(present.any(axis=0)):
            if numeric[k] not in self.kind:
                row = int(np.argmax(present[:, k]))
                self._saw(numeric[k], "number", cells[row, numeric[k]], locations[row])
        return values.astype(np.float32)

    def finish(self) -> tuple[np.ndarray, dict[str, tuple[str | None, ...]]]:
        x = np.concatenate(self.numbers)
        text = {}
        for j, pieces in sorted(self.text.items()):
            column: list[str | None] = [None] * self.rows
            for start, cells in pieces:
                column[start:start + len(cells)] = cells
            text[self.columns[j]] = tuple(column)
            x[:, j] = np.nan
        x.flags.writeable = False
        return x, text


def _spellings(tokens: list[str], most: int = 4096) -> list[str] | None:
    """Every upper/lower-case spelling of the tokens ("na": "na", "nA", "Na", "NA"), or None when there
    are more than `most`."""
    out: set[str] = set()
    for token in tokens:
        if 2 ** sum(c.lower() != c.upper() for c in token) + len(out) > most:
            return None
        out |= {"".join(chars) for chars in itertools.product(*({c.lower(), c.upper()} for c in token))}
    return sorted(out)


def _columns(cells: np.ndarray, numeric: list[int]) -> np.ndarray:
    """The `numeric` columns of `cells` (no copy when they are all of them)."""
    return cells if len(numeric) == cells.shape[1] else cells[:, numeric]


def _text_cells(cells: np.ndarray, missing: np.ndarray) -> list[str | None]:
    return [None if gone else str(cell) for cell, gone in zip(cells, missing, strict=True)]


_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")  # "1,5" or "-0,25": a number as a European spreadsheet writes it


def _parses(cells: np.ndarray) -> np.ndarray:
    """Which cells are numbers (what float() accepts: "1e5", " 2", "inf", "1_0"), vectorised when all are."""
    try:
        cells.astype(np.float64)
        return np.ones(cells.shape, dtype=bool)
    except ValueError:
        return np.array([_is_number(str(cell)) for cell in cells], dtype=bool)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


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
        counts = Counter(label for label in labels if label is not None)
        if max(counts.values()) < 2:  # (it trained to 0 % with generic warnings: nothing to generalise from)
            raise DataError(f"{where}: each of the {len(known)} classes has a single labeled record; a label "
                            "column that names every record apart is an identifier, not a class")
        _refuse_continuous(known, counts, where)
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


NUMERIC_CLASSES = 50  # more classes than this, every one a number, fewer than RECORDS_PER_CLASS labeled records each:
RECORDS_PER_CLASS = 5  # a measurement, not classes (class codes written as text, "c250.1", are taken as classes)


def _refuse_continuous(known: tuple[str, ...], counts: Counter, where: str) -> None:
    """A trial's log wage (689 "classes" over 2,434 records) trained 4.5 times longer as a classification, and its
    warning pointed at the IDs and the class weights, never at `task`."""
    labeled = sum(counts.values())
    if len(known) <= NUMERIC_CLASSES or any(_label_order(c)[0] for c in known) or \
            labeled >= RECORDS_PER_CLASS * len(known):
        return
    raise DataError(f"{where}: the label column holds {len(known)} different numbers over {labeled} labeled records "
                    f"(fewer than {RECORDS_PER_CLASS} each): a continuous target, not classes; set task = "
                    "\"regression\" in [federation] (the default is classification), bin the labels into classes, "
                    "or write class codes as text (\"c250\") to keep them as classes")


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
