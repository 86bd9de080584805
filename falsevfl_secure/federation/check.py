"""`federation check`: each party's own files checked against its own federation file, in about a second
and without starting a federation.

For a role it checks its identity key (an Ed25519 key readable by its owner only, and the key its own file
pins for it) and, for a party, reads the training table as `train` will (columns, numeric and categorical
types, missing cells, IDs and their normalisation, duplicates, at the active party the labels) and fits
the encoding; then the prediction table when it exists, as `predict` will: against the saved model when
one was trained with this configuration, else against the training table's columns and categories
(unseen categories are counted). Every pin was parsed when the file was read (a pin that is no Ed25519
key, or one key pinned for two roles, is refused there); `run_problems` names what a run also needs (every
role's pin, the he aggregator's address). `train` and `predict` run the same checks for every local role
before anything connects. Whether the parties' IDs overlap is checked here only where one host holds their
tables (the IDs are private), counted as the alignment counts them; else training reports it after the private
alignment.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ..config import MULTIPLIER_RANGE
from ..errors import FalseVflError, InputError
from ..secure import identity
from ..transport.protocols import protocol_named
from .aligned import is_labeled, validation_groups
from .config import AGGREGATOR, Federation
from .inputs import PartyInput, prediction_input, read_prediction_table, read_training_table
from .store import load_manifest, saved_weights

_MANY_CATEGORIES = 50  # a categorical column with more categories than this and ...
_MOSTLY_DISTINCT = 0.5  # ... more distinct values than this share of its cells looks like an identifier
_EXAMPLES = 3
NOTE = "  note: "
WIDE_CATEGORIES = 100  # a categorical column this wide is named with what it costs


@dataclass
class PartyCheck:
    """What the check found for one role: report lines, its problems (one line each; none: its files are
    fine) and what was read (the `PartyInput` that `train` or `predict` uses)."""

    name: str
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    inputs: PartyInput | None = None

    @property
    def notes(self) -> list[str]:
        """The lines that ask for attention (printed even by a quiet `train` or `predict`)."""
        return [line for line in self.lines if line.startswith(NOTE)]


def check_parties(fed: Federation, names: list[str], command: str) -> list[PartyCheck]:
    """The check of every named role for `command` ("check", "train" or "predict")."""
    reports = [check_party(fed, name, command) for name in names]
    if command != "predict":  # (a prediction asks for no overlap)
        _overlap_problems(fed, reports)
    return reports


def _overlap_problems(fed: Federation, reports: list[PartyCheck]) -> None:
    """Where this host holds the active party's table and another party's (one operator's trial): an error for each
    party whose listed IDs, as the rule normalises them, meet the active party's less than the alignment's
    min_overlap asks (a trial learned it 7 s into `train`). Compared here, on this host's own files; nothing is
    sent."""
    listed = {r.name: _listed_ids(r.inputs, r.name == fed.active) for r in reports if r.inputs is not None}
    if fed.active not in listed or fed.min_overlap <= 0:  # (min_overlap = 0 trains anyway)
        return
    active = set(listed[fed.active])
    for report in (r for r in reports if r.name in listed and r.name != fed.active):
        ids = listed[report.name]
        shared, base = len(active.intersection(ids)), min(len(active), len(ids))
        if not base or shared < fed.min_overlap * base:  # as the alignment counts (`aligned._short`): it would stop
            report.errors.append(_shortfall(fed, report, active, ids, shared, base))


def _shortfall(fed: Federation, report: PartyCheck, active: set, ids: list[str], shared: int, base: int) -> str:
    """The line for a party whose listed IDs meet too few of the active party's: why (IDs written otherwise, or,
    a review found, matching rows that hold no cell and so are not listed) and what to do."""
    rule = fed.id_rule.describe() if not fed.id_rule.is_plain else "as written"
    empty = len(active.intersection(report.inputs.table.ids)) - shared
    why = (f"; {empty} more of its IDs match, in rows holding no cell, which it does not list: fill them in, or "
           if empty else "; ") + ("normalise the IDs with id_pattern, id_strip_leading_zeros or id_fold_case in "
                                   "[federation] (`federation check` shows each party's IDs)")
    return (f"{'none' if not shared else f'only {shared}'} of the {len(ids)} IDs of {report.name!r} match the active "
            f"party's {len(active)} as compared ({rule}; the IDs of the rows each lists in the alignment), fewer than "
            f"min_overlap = {fed.min_overlap:g} of {base}: training would stop{why}")


def _listed_ids(inputs: PartyInput, active: bool) -> list[str]:
    """The IDs a party lists in the alignment, as `aligned.align_table` does: the active party every row, another
    party its rows holding a cell (a trial's 150 of 28,844 passed check with a note, then stopped training)."""
    ids = inputs.table.ids
    return list(ids) if active else [ids[i] for i in np.flatnonzero(inputs.block.held)]


def check_party(fed: Federation, name: str, command: str) -> PartyCheck:
    """Role `name`'s own files for `command`: (a party) its tables, then its key; each problem becomes one
    line of `errors`, never an exception."""
    result = PartyCheck(name, ["the aggregator:"] if name == AGGREGATOR else [])
    try:
        if name != AGGREGATOR:
            result.lines += _table_lines(fed, name, command, result)
    except FalseVflError as error:
        result.errors.append(str(error))
        # (a trial read this party's key line under the party before it: its own header was missing)
        result.lines.append(f"party {name!r}: its tables could not be read (its error is below)")
    try:
        result.lines.append(identity_line(fed, name))
    except FalseVflError as error:
        result.errors.append(str(error))
    return result


def _table_lines(fed: Federation, name: str, command: str, result: PartyCheck) -> list[str]:
    """Party `name`'s tables read as `command` reads them (kept in `result.inputs`), and the report lines."""
    fed.own(name)
    if command == "predict":
        result.inputs = _listable(fed, name, read_prediction_table(fed, name))
        return describe_prediction(fed, name, result.inputs)
    result.inputs = _listable(fed, name, read_training_table(fed, name))
    lines = describe_training(fed, name, result.inputs) + _budget_lines(fed, result.inputs)
    return lines + (_prediction_lines(fed, name, result.inputs) if command == "check" else [])


def _listable(fed: Federation, name: str, inputs: PartyInput) -> PartyInput:
    """`inputs`, refused where the party would list more IDs to the alignment than max_ids (every party refuses
    that alignment: a fuzzer's max_ids = 7 passed `check`)."""
    listed = len(_listed_ids(inputs, name == fed.active))
    if listed > fed.max_ids:
        raise InputError(f"party {name!r}: {inputs.table.path} would list {listed} IDs in the private alignment, more "
                         f"than [federation] max_ids = {fed.max_ids} of {fed.path} allows (every party refuses such an "
                         "alignment; max_ids is agreed: raise it in every party's file)")
    return inputs


def _budget_lines(fed: Federation, inputs: PartyInput) -> list[str]:
    """Under a privacy budget: what releasing the encoding with DP will drop (the party's own counts, to itself)."""
    privacy = fed.model.privacy
    if not privacy.enabled:
        return []
    from ..data.private_encoding import preview, refuse_local
    from ..privacy import ENCODING_DELTA_SHARE, encoding_multiplier
    from .inputs import encoding_charge

    refuse_local(inputs.table)  # as training will (its block with the '(other)' cells): refused here already
    if encoding_charge(fed, inputs.table) is None:  # (a privacy reviewer read "is released" of the one kept)
        said = "  under the privacy budget training reuses the encoding released for this table before, charged then"
    else:
        said = preview(inputs.table, encoding_multiplier(privacy), ENCODING_DELTA_SHARE * privacy.delta)
    return [said, _schedule_line(fed, inputs)]


def _schedule_line(fed: Federation, inputs: PartyInput) -> str:
    """What training's schedule would spend of this party's budget, from its own file and ledger as training counts
    them (its encoding charged again or not, the categories' threshold delta), and the smallest noise multiplier
    that fits it and one prediction run after (privacy review: nothing said either before `train` refused; a trial
    followed a suggestion that left no prediction run). The auto schedule is sized here for the records this
    party's table lists; training sizes it for the shared order. Past the budget or the release cap: a note."""
    from ..config import sized_schedule
    from ..privacy import TRAINING_PREDICTIONS, all_spent, exposure, read_ledger, spent, threshold_delta
    from .inputs import encoding_charge

    name, privacy, rows = inputs.table.party, fed.model.privacy, len(inputs.table.ids)
    labeled = int(is_labeled(inputs.targets).sum()) if inputs.targets is not None else rows
    cfg = sized_schedule(fed.model, rows, labeled)
    ledger = read_ledger(fed.own(name).model_dir)
    earlier, taken, release = all_spent(ledger), threshold_delta(ledger), encoding_charge(fed, inputs.table)
    if release is not None:
        earlier, taken = (*earlier, release.event), taken + release.delta
    protocol = protocol_named(fed.protocol)
    seen = exposure(cfg, protocol.hides_contributions, name == fed.active, bool(protocol.helpers))

    def at(z: float, predictions: int = TRAINING_PREDICTIONS):
        noised = replace(cfg, privacy=replace(privacy, noise_multiplier=z))
        return spent(noised, name, predictions, earlier=earlier, exposure=seen, threshold_delta=taken)

    used, then = at(privacy.noise_multiplier), at(privacy.noise_multiplier, TRAINING_PREDICTIONS + 1)
    text = (f"privacy: training (stage 1 {cfg.pretrain.epochs} epochs, stage 2 {cfg.train.epochs}; sized for the "
            f"{rows} records this table lists) would take {name}'s rows to about epsilon = {used.epsilon:.3g} "
            f"({used.releases} releases per row at noise multiplier {used.multiplier:g}, composed with its "
            f"encoding and its ledger; under {fed.protocol}), and one prediction run after it to {then.epsilon:.3g}; "
            f"{_fitting(partial(at, predictions=TRAINING_PREDICTIONS + 1), then.releases, earlier, taken, privacy)}")
    past = _past(privacy, used, then, sum(r for _, r in earlier))
    return f"{NOTE}{text}; {past}" if past else text


def _past(privacy, used, then, earlier: int) -> str:
    """What the check's numbers pass of the party's own file: its budget or its release cap (training refuses
    those; a trial saw `check` say nothing and `train` refuse after charging the encoding)."""
    budget, cap = privacy.epsilon * (1 + 1e-9), privacy.max_releases_per_row
    if used.epsilon > budget:
        return f"that is past its budget epsilon = {privacy.epsilon:g}: training would refuse it"
    if cap and used.releases + earlier > cap:
        return (f"its rows would be released {used.releases + earlier} times with what its ledger holds, past its "
                f"max_releases_per_row = {cap}: training would refuse it")
    if then.epsilon > budget or (cap and then.releases + earlier > cap):
        return "training fits its budget but leaves no room for a prediction run"
    return ""


def _fitting(at, releases: int, earlier, taken: float, privacy) -> str:
    """The smallest noise multiplier, at three significant digits rounded up, whose schedule (and one prediction
    run) stays within the budget by `at`'s own count: the composed Gaussians' closed form at the Gaussian part of
    delta, checked."""
    from ..privacy import calibrate

    try:
        z = calibrate(privacy.epsilon + math.log1p(-taken), releases, privacy.delta - taken, earlier)
    except InputError:
        return "no noise fits it: what its ledger records takes the whole budget"
    for _ in range(20):
        z = _up3(z)
        if at(z).epsilon <= privacy.epsilon * (1 + 1e-9):
            return _fits_from(z)
        z *= 1.002
    return "no noise multiplier found that fits both"


def _fits_from(z: float) -> str:
    """The smallest fitting multiplier `z` said within the range the file allows (a trial's epsilon 1e9 was
    "fitted" by 2e-05, a review's epsilon 0.001 by 49000: the file refuses both)."""
    low, high = MULTIPLIER_RANGE
    if z < low:
        return f"any noise_multiplier the file allows (from {low:g}) fits both: a budget this large bounds little"
    if z > high:
        return (f"only a noise_multiplier of {z:g} or more fits both, past the {high:g} the file allows: fewer epochs "
                "(or `preset = \"quick\"`) or a larger epsilon")
    return f"noise_multiplier = {z:g} or more fits both"


def _up3(z: float) -> float:
    """`z` rounded up to three significant digits."""
    scale = 10 ** (math.floor(math.log10(z)) - 2)
    return math.ceil(z / scale - 1e-9) * scale


def role_text(name: str) -> str:
    return "the aggregator" if name == AGGREGATOR else f"party {name!r}"


def identity_line(fed: Federation, name: str) -> str:
    """Role `name`'s own key file: a usable Ed25519 key, and the one its own file pins for it (a key that
    is not would fail at the TLS handshake, after the join timeout, with the peer's words)."""
    path, who = fed.identity_path(name), role_text(name)
    try:
        public = identity.public_bytes(identity.read_private_key(path))
    except identity.IdentityError as error:
        raise InputError(f"{who}: {error}") from None
    pinned, fingerprint = fed.pinned(), identity.fingerprint(public)
    if pinned.get(name) == public:
        return f"  key: {path} holds the key pinned for {name} (fingerprint {fingerprint})"
    if name not in pinned:
        pin = identity.pin_text(public)
        return f"{NOTE}{path} holds the key of {who}, not pinned yet: every file pins key = \"{pin}\""
    owner = next((role for role, key in pinned.items() if key == public), None)
    if owner is not None:
        raise InputError(f"{who}: {path} holds the key {fed.path} pins for {role_text(owner)}, not for {who}: "
                         f"this is {owner}'s key file; give {name} its own (`federation keygen --party {name}`, or "
                         "its `identity` setting)")
    raise InputError(f"{who}: {path} holds a key (fingerprint {fingerprint}) that {fed.path} does not pin for "
                     f"{name} (it pins fingerprint {identity.fingerprint(pinned[name])}): the key file is not "
                     f"{name}'s, or its pin is mistyped. This key's line is key = \"{identity.pin_text(public)}\"")


def has_aggregator(protocol: str) -> bool:
    """Whether the protocol runs the aggregator role (he)."""
    return bool(protocol_named(protocol).helpers)


def shared_folders(fed: Federation, names: list[str]) -> list[str]:
    """Parties run (or checked) together on this host that keep their models in one folder, or one inside the other
    (a fuzzer's shared folder passed `check`, and `train` then said another run was using it). Another host's entry
    is not compared: a file copied to every host may name each party's folder alike."""
    folders = [(n, fed.party(n).model_dir.resolve()) for n in names if n != AGGREGATOR and fed.party(n).model_dir]
    problems = []
    for (a, one), (b, other) in itertools.combinations(folders, 2):
        if one == other or one in other.parents or other in one.parents:
            what = f"both name the model folder {str(one)!r}" if one == other else \
                f"name the model folders {str(one)!r} and {str(other)!r}, one inside the other"
            problems.append(f"{fed.path}: parties {a!r} and {b!r} {what}: each party keeps its model, checkpoints "
                            "and ledger in a folder of its own")
    return problems


def run_problems(fed: Federation, protocol: str, one_host: bool) -> list[str]:
    """What a run under `protocol` needs of the file beyond each role's own files: a pin for every role,
    and with one host per party the aggregator's address."""
    problems = []
    try:
        fed.pins(with_aggregator=has_aggregator(protocol))
    except InputError as error:
        problems.append(str(error))
    if one_host and has_aggregator(protocol) and fed.aggregator.address is None:
        problems.append(f"{fed.path}: protocol {protocol} needs [aggregator] address = \"HOST:PORT\" (where the "
                        "aggregator listens)")
    return problems


def _prediction_lines(fed: Federation, name: str, training: PartyInput) -> list[str]:
    """The prediction table against the saved model (when trained with this configuration) or else
    against the training table."""
    spec = fed.own(name)
    if not spec.predict.exists():
        return [f"  no prediction table yet ({spec.predict})"]
    notes = []
    if (spec.model_dir / "manifest.json").exists():
        try:
            manifest = load_manifest(spec.model_dir, name, fed.model)
            if manifest.weights is not None:  # (a fuzzer's garbage model.pt passed check)
                saved_weights(spec.model_dir, manifest.weights)
            return describe_prediction(fed, name, _listable(fed, name, prediction_input(
                fed, name, manifest.encoding, manifest.classes, manifest)), "the saved model") + \
                _prediction_budget(fed, name, manifest)
        except FalseVflError as error:
            if "trained with other settings" not in str(error):
                raise
            notes.append(f"{NOTE}the saved model in {spec.model_dir} was trained with other settings; "
                         "`train` replaces it")
    inputs = _listable(fed, name, prediction_input(fed, name, training.encoding, training.classes or None))
    untrained = [] if notes else [f"  no trained model in {spec.model_dir} yet: `predict` needs `train` first"]
    return [*describe_prediction(fed, name, inputs, "the training table"), *notes, *untrained]


def _prediction_budget(fed: Federation, name: str, manifest) -> list[str]:
    """Under a privacy budget: a note where `predict` would be refused by this party's own ledger and file (a privacy
    reviewer's trial: check said nothing of a ledger past a lowered budget, or of a budget with no run left)."""
    if not fed.model.privacy.enabled:
        return []
    from ..privacy import exposure, prediction_refusal

    protocol = protocol_named(fed.protocol)
    seen = exposure(fed.model, protocol.hides_contributions, name == fed.active, bool(protocol.helpers))
    refusal = prediction_refusal(fed.model, name, fed.own(name).model_dir, seen, trained_in=manifest.trained_in)
    return [] if refusal is None else [f"{NOTE}`predict` would be refused: {refusal}"]


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
    if encoding.quantiles and not fed.model.privacy.enabled:  # (a trial: only the manifest said which columns)
        lines.append(f"  at their normal scores (numeric_encoding = \"{fed.model.numeric_encoding}\"): "
                     + ", ".join(c for c in table.columns if c in encoding.quantiles))
    lines += _id_lines(fed, table) + _class_spellings(inputs)
    lines += [f"{NOTE}column {c!r} has {len(encoding.categories[c])} categories in "
              f"{sum(v is not None for v in table.text[c])} cells: if it identifies records, remove it"
              for c in table.categorical if _looks_like_identifier(table.text[c])]
    lines += [f"{NOTE}column {c!r} has one value ({v}) in every row that has one: it tells the model nothing "
              "(remove it, or check the export)" for c, v in _constant_columns(table)]
    lines += [f"{NOTE}column {c!r} has {len(encoding.categories[c]):,} categories, {len(encoding.categories[c]):,} of "
              f"this party's {encoding.width:,} encoded cells: every row carries them through its networks, so its "
              "memory and step time grow with them; grouping the rare ones shrinks it"
              for c in table.categorical if len(encoding.categories[c]) >= WIDE_CATEGORIES
              and not _looks_like_identifier(table.text[c])]  # (a trial's 532 occupations: 1,250 MiB, others 560)
    if name == fed.active and fed.validation_group:
        lines.append(_groups_line(fed, inputs))
    if name != fed.active and fed.label_column in table.columns:
        lines.append(f"{NOTE}column {fed.label_column!r} has the label column's name; it is a feature of party "
                     f"{name!r}: if it is the label (or computed from it), remove it, or the model learns it from "
                     "that party's rows and scores above what it can predict where the label is unknown")
    return lines


def _constant_columns(table) -> list[tuple[str, str]]:
    """(column, its one value) of each column whose present cells all hold one value (operations trial: a
    column of one category was taken in silence)."""
    out = []
    for k, column in enumerate(table.columns):
        if column in table.text:
            values = {v for v in table.text[column] if v is not None}
        else:
            values = set(np.unique(table.x[:, k][~np.isnan(table.x[:, k])]).tolist())
        if len(values) == 1:
            value = next(iter(values))
            out.append((column, repr(value) if isinstance(value, str) else f"{value:g}"))
    return out


def _groups_line(fed: Federation, inputs: PartyInput) -> str:
    """[federation] validation_group: how many groups the labeled rows fall in (an unknown column is refused)."""
    labeled = np.flatnonzero(is_labeled(inputs.targets))
    groups = validation_groups(inputs.table, labeled, fed)[labeled]
    return (f"  validation records: whole groups of {', '.join(fed.validation_group)} "
            f"({np.unique(groups).size} groups among {groups.size} labeled rows)")


def _unseen_how(fed: Federation, inputs: PartyInput) -> str:
    """What a prediction cell of a category outside the encoding is, and how it is encoded."""
    if inputs.encoding.private:
        return "categories the model's encoding (released with DP) does not hold, encoded in its '(other)' cell"
    if fed.model.privacy.enabled:  # `check` before training: the encoding trained under the budget will have one
        return "categories unseen in training, encoded in the '(other)' cell of an encoding released under the budget"
    return "categories unseen in training, encoded as missing"


def describe_prediction(fed: Federation, name: str, inputs: PartyInput, against: str = "the saved model") -> list[str]:
    """Report lines of a prediction table: rows, matched columns, missing cells, unseen categories."""
    table, block = inputs.table, inputs.block
    lines = [f"party {name!r}: {table.path}: {table.n_rows} rows ({int(block.held.sum())} holding features), "
             f"the {len(table.columns)} columns match {against} by name; {_missing(table)} missing cells"]
    if block.unseen:
        listed = "; ".join(f"{c}: {count} ({', '.join(repr(v) for v in values)})"
                           for c, (count, values) in block.unseen.items())
        lines.append(f"{NOTE}{block.unseen_cells} cells hold {_unseen_how(fed, inputs)}: {listed}")
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
    counts, shown = Counter(labels), inputs.classes[:_CLASSES_SHOWN]
    more = len(inputs.classes) - len(shown)  # (a trial's 689 classes made one line of 10,580 characters)
    listed = ", ".join(f"{c!r}: {counts[c]}" for c in shown) + (f", and {more} more classes" if more else "")
    return f"; {len(labels)} labeled ({listed})"


_CLASSES_SHOWN = 20


def _class_spellings(inputs: PartyInput) -> list[str]:
    """A note for classes that differ only in case or spaces (a trial's 3 labels 'No' beside 30,807 'no' trained as a
    class of their own, without a word)."""
    if inputs.targets is None or inputs.target_scale is not None:
        return []
    counts, alike = Counter(label for label in inputs.table.labels if label is not None), {}
    for label in inputs.classes:
        alike.setdefault(" ".join(label.casefold().split()), []).append(label)
    return [f"{NOTE}the labels {' and '.join(f'{c!r} ({counts[c]})' for c in group)} differ only in case or spaces: "
            "each is a class of its own; write one class one way" for group in alike.values() if len(group) > 1]


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

