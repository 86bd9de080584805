"""A party's own files, read and checked before it joins a federation (and by `federation check`): the
table, the encoding of its block and, at the active party, the targets as the model sees them.

Nothing here imports torch, so `federation check` stays fast.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..data.encoding import EncodedBlock, Encoding, encode, fit_encoding
from ..data.errors import DataError
from ..data.tables import PartyTable, encode_labels, read_party_table
from ..data.targets import TargetScale
from ..fsio import atomic_write, read_regular
from .config import Federation
from .store import Manifest, load_manifest


@dataclass(frozen=True, eq=False)
class PartyInput:
    """A party's checked files: its table, the encoding (fitted on the training table, or the saved
    model's), the encoded block and, at the active party, the targets as the model sees them (class
    indices, or the standardised regression target; -1 / NaN where unlabeled)."""

    table: PartyTable
    encoding: Encoding
    block: EncodedBlock
    manifest: Manifest | None = None  # prediction: the saved model's manifest
    targets: np.ndarray | None = None
    classes: tuple[str, ...] = ()
    target_scale: TargetScale | None = None
    release: object | None = None  # training under a budget: what the private encoding released (EncodingRelease)


def _labels(fed: Federation, table: PartyTable, classes=None) -> tuple[np.ndarray, tuple[str, ...]]:
    return encode_labels(table.labels, classes, fed.task, table.where, table.locations)


def read_training_table(fed: Federation, name: str, private: bool = False) -> PartyInput:
    """Party `name`'s training table, encoded and checked before the party joins the federation; `private` (a
    run that releases anything about the rows) under a privacy budget: the encoding released with DP."""
    labels = fed.label_column if name == fed.active else None
    table = read_party_table(fed.own(name).train, name, fed.id_column, labels, options=fed.read_options(name))
    encoding, release = _encoding(fed, table, private)
    block = encode(table, encoding)
    if name != fed.active:
        return PartyInput(table, encoding, block, release=release)
    raw, classes = _labels(fed, table)  # unusable labels are refused before any other party waits
    if fed.task == "classification":
        return PartyInput(table, encoding, block, None, raw, classes, release=release)
    try:
        scale = TargetScale.fit(raw)
    except DataError as error:
        raise DataError(f"{table.where}: {error}") from None
    values = np.unique(raw[~np.isnan(raw)])
    if values.size < 2:  # (review finding: it trained, validation read R^2 nan; classification refuses one class)
        raise DataError(f"{table.where}: label column {fed.label_column!r}: the labeled records hold "
                        f"{'one value' if values.size else 'no value'} ({', '.join(f'{v:g}' for v in values)}); a "
                        "regression needs at least two different values")
    return PartyInput(table, encoding, block, None, scale.transform(raw), (), scale, release)


RELEASED = "encoding.released.json"  # in a party's model folder: its encoding released with DP, kept for reuse


def _encoding(fed: Federation, table: PartyTable, private: bool) -> tuple[Encoding, object | None]:
    """The encoding fitted in clear, or under the party's own budget the one released with DP from its own fresh
    secret (data/private_encoding.py), charged to its own ledger before it is drawn, and kept in its model folder:
    a later run over the same table at the same budget (training again, after `propose-clips`) reuses it,
    post-processing, uncharged."""
    privacy = fed.model.privacy
    if not (private and privacy.enabled):
        return fit_encoding(table, numeric=fed.model.numeric_encoding), None
    from ..data.private_encoding import private_encoding, refuse_local
    from ..privacy import charge_encoding
    from ..randomness import RoleSecret

    refuse_local(table)  # what fails on the rows alone fails before anything is charged
    release, path, key, kept = _planned_release(fed, table)
    if kept is not None and _accounted(path.parent, kept[1]):
        return kept
    charge_encoding(fed.model, table.party, path.parent, release)
    if kept is not None:  # released before, but its ledger (reset since) no longer counts it: counted again
        return kept[0], replace(kept[1], reused=False)
    encoding, release = private_encoding(table, release.multiplier, release.delta,
                                         RoleSecret.fresh().stream("encoding"))
    atomic_write(path, json.dumps({"table": key, "encoding": encoding.to_dict(), "release": asdict(release)}),
                 private=True)
    return encoding, release


def _planned_release(fed: Federation, table: PartyTable):
    """(the `EncodingRelease` a private encoding of `table` makes under the party's budget, the kept file's path,
    the table's key, the kept encoding that release may reuse or None)."""
    from ..data.private_encoding import EncodingRelease
    from ..privacy import ENCODING_DELTA_SHARE, encoding_multiplier

    privacy = fed.model.privacy
    release = EncodingRelease(encoding_multiplier(privacy),
                              ENCODING_DELTA_SHARE * privacy.delta if table.categorical else 0.0)
    path, key = fed.party(table.party).model_dir / RELEASED, table_key(table)
    return release, path, key, _kept(path, key, release)


def encoding_charge(fed: Federation, table: PartyTable):
    """What training's encoding would charge under the party's budget (an `EncodingRelease`), or None where a kept
    one its ledger counts is reused: `_encoding`'s decision, for `check`'s estimate."""
    release, path, _, kept = _planned_release(fed, table)
    return None if kept is not None and _accounted(path.parent, kept[1]) else release


def table_key(table: PartyTable) -> str:
    """sha256 of a table as read (its IDs, columns and every cell, written unambiguously as JSON): a released
    encoding is reused for that table only."""
    text = [table.text[name] for name in sorted(table.text)]
    digest = hashlib.sha256(json.dumps([table.ids, table.columns, sorted(table.text), text]).encode())
    digest.update(np.ascontiguousarray(table.x, dtype=np.float32).tobytes())
    return digest.hexdigest()


def _accounted(folder: Path, release) -> bool:
    """Whether the party's ledger counts a release like this one (a ledger deleted to start afresh does not: a
    kept encoding reused uncharged would then be missing from the epsilon it reports; privacy review finding)."""
    from ..privacy import all_spent, read_ledger

    wanted = release.event
    return any(math.isclose(float(z), wanted[0], rel_tol=1e-12) and int(r) == wanted[1]
               for z, r in all_spent(read_ledger(folder)))


def _kept(path: Path, key: str, wanted) -> tuple[Encoding, object] | None:
    """The released encoding kept at `path`, where it was drawn from the table `key` names at the multiplier and
    delta `wanted` asks for (an `EncodingRelease`); None otherwise, or for a file that is not one (a fresh one is
    then drawn and charged)."""
    from ..data.private_encoding import EncodingRelease

    try:
        kept = json.loads(read_regular(path))
        release = EncodingRelease(**kept["release"])
        if kept["table"] != key or (release.multiplier, release.delta) != (wanted.multiplier, wanted.delta):
            return None
        encoding = Encoding.from_dict(kept["encoding"])
        if not encoding.private or release.releases != wanted.releases or not release.plausible():
            return None
        return encoding, replace(release, reused=True)
    except (OSError, ValueError, KeyError, TypeError, DataError, RecursionError):
        return None


def read_prediction_table(fed: Federation, name: str) -> PartyInput:
    """Party `name`'s saved model and prediction table (columns matched by name), checked against each
    other before it joins."""
    manifest = load_manifest(fed.own(name).model_dir, name, fed.model)
    return prediction_input(fed, name, manifest.encoding, manifest.classes, manifest)


def prediction_input(fed: Federation, name: str, encoding: Encoding, classes: tuple[str, ...] | None,
                     manifest: Manifest | None = None) -> PartyInput:
    """Party `name`'s prediction table read against an encoding (the saved model's, or for `check` before
    training the one fitted on the training table): the same columns by name, the same kinds."""
    labels = fed.label_column if name == fed.active else None
    options = fed.read_options(name, detect_categories=False, categorical=tuple(encoding.categories))
    table = read_party_table(fed.own(name).predict, name, fed.id_column, labels, expected_columns=encoding.columns,
                             label_optional=True, options=options)
    if table.labels is not None and fed.task == "classification" and classes:
        _labels(fed, table, classes)  # labels in a prediction table are for scoring only, but must be known ones
    elif table.labels is not None and fed.task == "regression":
        _labels(fed, table)
    return PartyInput(table, encoding, encode(table, encoding), manifest)
