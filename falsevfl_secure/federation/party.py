"""What one party of a federation does, in its own process and with its own files only.

`federation_program` is what every role runs: in `train`, a party aligns its training table with the
others', standardises its block with its own rows' statistics, trains the unchanged FALSE-VFL core and
saves its part of the model and its own communication counters; in `predict`, the parties present align
their prediction tables, load their saved parts, and the active party writes the predictions. The he
aggregator has no files: it serves its protocol.
"""

from __future__ import annotations

import csv
import io
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..data.standardize import Standardizer
from ..data.tables import PartyTable, encode_labels, read_party_table
from ..fsio import atomic_write, write_json
from ..node import build_node, resolve_device
from ..runtime.distributed import agree_resume
from ..train import fit, host_split, predict_split
from .aligned import Aligned, align_table, is_labeled, party_view
from .config import Federation, load_federation
from .store import Manifest, load_manifest, load_weights, save_model


def _targets(fed: Federation, table: PartyTable, classes=None) -> tuple[np.ndarray, tuple[str, ...]]:
    return encode_labels(table.labels, classes, fed.task, table.where, table.locations)


def _n_classes(fed: Federation, classes: tuple[str, ...]) -> int:
    return len(classes) if fed.task == "classification" else 1


def read_training_table(fed: Federation, name: str) -> PartyTable:
    """Party `name`'s training table, checked before the party joins the federation."""
    labels = fed.label_column if name == fed.active else None
    table = read_party_table(fed.party(name).train, name, fed.id_column, labels)
    if name == fed.active:
        _targets(fed, table)  # unusable labels are refused before any other party waits
    return table


def read_prediction_table(fed: Federation, name: str) -> tuple[PartyTable, Manifest]:
    """Party `name`'s saved model and prediction table, checked against each other before it joins."""
    manifest = load_manifest(fed.party(name).model_dir, name, fed.model)
    labels = fed.label_column if name == fed.active else None
    table = read_party_table(fed.party(name).predict, name, fed.id_column, labels, expected_columns=manifest.columns,
                             label_optional=True)
    if table.labels is not None:  # labels in a prediction table are for scoring only, but must be known ones
        _targets(fed, table, manifest.classes)
    return table, manifest


def read_inputs(fed: Federation, name: str, command: str):
    """Role `name`'s own files for `command`, checked (before it joins: a bad table is named at once)."""
    from .config import AGGREGATOR

    if name == AGGREGATOR:
        return None
    return read_training_table(fed, name) if command == "train" else read_prediction_table(fed, name)


def federation_program(role, config: str, command: str, options: dict):
    """The program of any role of `federation train` / `predict`: it reads its own files only (the he
    aggregator has none: it serves its protocol)."""
    fed = load_federation(config)
    if not role.is_party:
        role.serve_helper()
        return None
    if role.session.left_out:
        print(f"left out (did not join within {fed.join_timeout_s:g} s): {', '.join(role.session.left_out)}",
              file=sys.stderr, flush=True)
    inputs = read_inputs(fed, role.spec.name, command)
    return _train(role, fed, inputs, options) if command == "train" else _predict(role, fed, inputs, options)


def _train(role, fed: Federation, table: PartyTable, options: dict) -> None:
    """Align, standardise with its own rows, train the FALSE-VFL core, save its own part of the model."""
    started, me, rank = time.perf_counter(), fed.party(role.spec.name), role.rank
    targets, classes = _targets(fed, table) if role.is_active else (None, ())
    aligned = align_table(role, table, np.flatnonzero(is_labeled(targets)) if targets is not None else None,
                          restrict=False, max_ids=fed.max_ids)
    scaler = Standardizer.fit(table.x, table.held)
    cfg, device = fed.model, resolve_device(fed.model.device)
    n_classes = _n_classes(fed, classes) if role.is_active else None
    node = build_node(cfg, {rank: len(table.columns)}, n_classes, role.transport(device), device)
    data = host_split(party_view(table, aligned, scaler, rank, targets), device,
                      n_classes if fed.task == "classification" else None)
    progress = options.get("progress", False) and role.is_active
    trained = fit(node, data, me.model_dir / "checkpoints", options.get("resume", False), progress,
                  agree_resume(role))
    manifest = Manifest(me.name, table.columns, scaler, cfg.fingerprint(), cfg.training_settings(),
                        role.protocol.name, classes or None)
    save_model(me.model_dir, node, rank, manifest)
    own = {"communication": node.transport.log.table(), "protocol": role.protocol.name}
    write_json(me.model_dir / "train_log.json", own)  # this party's own counters stay with it
    if role.is_active:
        write_json(me.model_dir / "train_result.json", _train_record(
            fed, role.protocol.name, aligned, trained, own["communication"], time.perf_counter() - started))


def _train_record(fed: Federation, protocol: str, aligned: Aligned, trained, communication: list[dict],
                  wall: float) -> dict:
    rows = dict(zip(fed.names, aligned.holders.sum(axis=0).tolist(), strict=True))
    return {"losses": trained.losses, "stage_time_s": trained.seconds, "wall_time_s": round(wall, 3),
            "protocol": protocol, "alignment": {"union_size": aligned.n + aligned.dropped, "records": aligned.n,
                                                "rows_per_party": rows, "labeled": int(aligned.labeled.size),
                                                "dropped_no_observed_party": aligned.dropped,
                                                "seconds": round(aligned.seconds, 3)},
            "communication": communication, "config": fed.model.to_dict()}


def _predict(role, fed: Federation, loaded: tuple[PartyTable, Manifest], options: dict) -> None:
    """Among the parties present (the world is theirs alone: records held only by absent parties simply
    have fewer holders), align the prediction tables, load this party's part, predict."""
    present = list(role.session.present)
    cfg = replace(fed.model, parties=len(present), active_party=present.index(fed.active))
    me, rank = fed.party(role.spec.name), role.rank
    table, manifest = loaded
    aligned = align_table(role, table, None, restrict=True, max_ids=fed.max_ids)
    device = resolve_device(cfg.device)
    n_classes = _n_classes(fed, manifest.classes or ()) if role.is_active else None
    node = build_node(cfg, {rank: len(manifest.columns)}, n_classes, role.transport(device), device)
    load_weights(me.model_dir, node, rank)
    view = party_view(table, aligned, manifest.standardizer, rank, None)
    predictions = predict_split(node, host_split(view, device))
    if role.is_active:
        atomic_write(Path(options["out"]), _predictions_csv(table, aligned, predictions.get().numpy(),
                                                            manifest.classes))


def _predictions_csv(table: PartyTable, aligned: Aligned, predictions: np.ndarray,
                     classes: tuple[str, ...] | None) -> str:
    """One row per record the active party listed: id, prediction, parties observed, class probabilities
    (empty where no present party holds the record's features)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    probability_columns = [f"p_{c}" for c in classes] if classes else []
    writer.writerow(["id", "prediction", "parties_observed", *probability_columns])
    observed = aligned.holders.sum(axis=1)
    for row, position in enumerate(aligned.positions):
        if position < 0:
            writer.writerow([table.ids[row], "", 0, *([""] * len(probability_columns))])
        elif classes:
            p = predictions[position]
            writer.writerow([table.ids[row], classes[int(p.argmax())], int(observed[position]),
                             *(f"{v:.6f}" for v in p)])
        else:
            writer.writerow([table.ids[row], f"{float(predictions[position]):.6g}", int(observed[position])])
    return buffer.getvalue()
