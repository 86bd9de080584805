"""`federation check`: each party's own files checked against the federation file, in about a second and
without starting a federation.

For a party it reads the training table as `train` will (columns, numeric and categorical types, missing
cells, IDs and their normalisation, duplicates, at the active party the labels) and fits the encoding;
then the prediction table when it exists, as `predict` will: against the saved model when one was
trained with this configuration, else against the training table's columns and categories (unseen
categories are counted). `train` and `predict` run the same check for every local party before anything
is launched. Whether the parties' IDs overlap cannot be checked here (the IDs are private): training
reports it after the private alignment.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ..errors import FalseVflError
from .config import AGGREGATOR, Federation
from .inputs import PartyInput, prediction_input, read_prediction_table, read_training_table
from .store import load_manifest

_MANY_CATEGORIES = 50  # a categorical column with more categories than this and ...
_MOSTLY_DISTINCT = 0.5  # ... more distinct values than this share of its cells looks like an identifier
_EXAMPLES = 3
NOTE = "  note: "


@dataclass
class PartyCheck:
    """What the check found for one party: report lines, the error (None: the files are fine) and what
    was read (the `PartyInput` that `train` or `predict` uses)."""

    name: str
    lines: list[str] = field(default_factory=list)
    error: str | None = None
    inputs: PartyInput | None = None

    @property
    def notes(self) -> list[str]:
        """The lines that ask for attention (printed even by a quiet `train` or `predict`)."""
        return [line for line in self.lines if line.startswith(NOTE)]


def check_parties(fed: Federation, names: list[str], command: str) -> list[PartyCheck]:
    """The check of every named party for `command` ("check", "train" or "predict")."""
    return [check_party(fed, name, command) for name in names]


def check_party(fed: Federation, name: str, command: str) -> PartyCheck:
    """One party's files for `command`; a problem becomes `error` (one line), never an exception."""
    result = PartyCheck(name)
    if name == AGGREGATOR:
        result.lines.append("the aggregator has no files to check")
        return result
    try:
        fed.party(name)
        if command in ("check", "train"):
            result.inputs = read_training_table(fed, name)
            result.lines += describe_training(fed, name, result.inputs)
        if command == "check":
            result.lines += _prediction_lines(fed, name, result.inputs)
        if command == "predict":
            result.inputs = read_prediction_table(fed, name)
            result.lines += describe_prediction(fed, name, result.inputs)
    except FalseVflError as error:
        result.error = str(error)
    return result


def _prediction_lines(fed: Federation, name: str, training: PartyInput) -> list[str]:
    """The prediction table against the saved model (when trained with this configuration) or else
    against the training table."""
    spec = fed.party(name)
    if not spec.predict.exists():
        return [f"  no prediction table yet ({spec.predict})"]
    notes = []
    if (spec.model_dir / "manifest.json").exists():
        try:
            manifest = load_manifest(spec.model_dir, name, fed.model)
            return describe_prediction(fed, name, prediction_input(fed, name, manifest.encoding, manifest.classes,
                                                                   manifest), "the saved model")
        except FalseVflError as error:
            if "trained with other settings" not in str(error):
                raise
            notes.append(f"{NOTE}the saved model in {spec.model_dir} was trained with other settings; "
                         "`train` replaces it")
    inputs = prediction_input(fed, name, training.encoding, training.classes or None)
    return [*describe_prediction(fed, name, inputs, "the training table"), *notes]


def describe_training(fed: Federation, name: str, inputs: PartyInput) -> list[str]:
    """Report lines of a training table: rows, columns by type, missing cells, IDs, labels, notes."""
    table, encoding = inputs.table, inputs.encoding
    role = " (active)" if name == fed.active else ""
    categories = ", ".join(f"{c}: {len(encoding.categories[c])} categories" for c in table.categorical)
    kinds = f"{len(encoding.numeric)} numeric, {len(table.categorical)} categorical" + (
        f" ({categories})" if categories else "")
    lines = [f"party {name!r}{role}: {table.path}: {table.n_rows} rows ({int(inputs.block.held.sum())} holding "
             f"features), {len(table.columns)} columns: {kinds}, {encoding.width} encoded cells; "
             f"{_missing(table)} missing cells{_labels_text(fed, inputs)}"]
    lines += _id_lines(fed, table)
    lines += [f"{NOTE}column {c!r} has {len(encoding.categories[c])} categories in "
              f"{sum(v is not None for v in table.text[c])} cells: if it identifies records, remove it"
              for c in table.categorical if _looks_like_identifier(table.text[c])]
    if name != fed.active and fed.label_column in table.columns:
        lines.append(f"{NOTE}column {fed.label_column!r} has the label column's name; it is a feature of "
                     f"party {name!r}")
    return lines


def describe_prediction(fed: Federation, name: str, inputs: PartyInput, against: str = "the saved model") -> list[str]:
    """Report lines of a prediction table: rows, matched columns, missing cells, unseen categories."""
    table, block = inputs.table, inputs.block
    lines = [f"party {name!r}: {table.path}: {table.n_rows} rows ({int(block.held.sum())} holding features), "
             f"the {len(table.columns)} columns match {against} by name; {_missing(table)} missing cells"]
    if block.unseen:
        listed = "; ".join(f"{c}: {count} ({', '.join(repr(v) for v in values)})"
                           for c, (count, values) in block.unseen.items())
        lines.append(f"{NOTE}{block.unseen_cells} cells hold categories unseen in training, encoded as missing: "
                     f"{listed}")
    return lines + _id_lines(fed, table)


def _missing(table) -> int:
    """Missing cells among the rows that hold features."""
    observed = table.observed
    return int((~observed[observed.any(axis=1)]).sum())


def _labels_text(fed: Federation, inputs: PartyInput) -> str:
    if inputs.targets is None:
        return ""
    labels = [label for label in inputs.table.labels if label is not None]
    if inputs.target_scale is not None:
        return (f"; {len(labels)} labeled (target mean {inputs.target_scale.mean:.4g}, "
                f"std {inputs.target_scale.std:.4g})")
    counts = Counter(labels)
    return f"; {len(labels)} labeled ({', '.join(f'{c!r}: {counts[c]}' for c in inputs.classes)})"


def _id_lines(fed: Federation, table) -> list[str]:
    """A few IDs as the parties will compare them (only this party's own terminal shows them)."""
    if fed.id_rule.is_plain:
        shown = ", ".join(repr(i) for i in table.ids[:_EXAMPLES])
        return [f"  IDs compared as written (stripped), e.g. {shown}"]
    pairs = ", ".join(f"{raw!r} -> {key!r}" for raw, key in zip(table.raw_ids[:_EXAMPLES], table.ids, strict=False))
    return [f"  IDs normalised ({fed.id_rule.describe()}), e.g. {pairs}"]


def _looks_like_identifier(cells: tuple[str | None, ...]) -> bool:
    present = [c for c in cells if c is not None]
    distinct = len(set(present))
    return distinct > _MANY_CATEGORIES and distinct > _MOSTLY_DISTINCT * max(len(present), 1)


def timed_check(fed: Federation, names: list[str], command: str) -> tuple[list[PartyCheck], float]:
    """`check_parties` and the seconds it took."""
    started = time.perf_counter()
    reports = check_parties(fed, names, command)
    return reports, time.perf_counter() - started

