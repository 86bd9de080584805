"""What one party of a federation does, in its own process and with its own files only.

The party's files are read and checked before it joins (`inputs.read_training_table` and
`read_prediction_table`, the functions `federation check` runs). `federation_program` is what every role
runs: in `train`, a party aligns its training table with the others', encodes its block with its own
rows' statistics (data/encoding.py), trains the FALSE-VFL core, measures the model on the held-out
validation records and saves its part and its own communication counters (never sent to another party);
in `predict`, the parties present align their prediction tables, load their saved parts, and the active
party writes the predictions. Every output is written to its staged place (`fsio.staged`); the launcher
moves it into place once the whole run has ended well (`launch.py`). A listed party that did not join ends
a prediction unless it was declared absent (`--absent`) or the active party's file consents. The he
aggregator has no files: it serves its protocol.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ..config import sized_schedule
from ..data.tables import PartyTable
from ..errors import InputError, ProtocolError
from ..fsio import atomic_write, read_regular, staged, write_json
from ..heap import peak_rss_mib
from ..methods import build_node, method_for
from ..methods.false_vfl_steps import own_groups
from ..model.likelihood import CellLayout
from ..model.trees import TreesHead
from ..network.wire import Refused
from ..node import resolve_device
from ..placement import Active
from ..privacy import (
    charge_prediction,
    charge_rerun,
    charge_training,
    exposure,
    ledger_held,
    prediction_refusal,
    read_ledger,
    training_refusal,
)
from ..randomness import record_keys
from ..reference import FOLDS, fit_reference, lift_lines, lift_report, own_scores, refit_scores, save_own_rows
from ..runtime.distributed import agree_resume
from ..train import fit, host_split, predict_split, solo_work_units
from .aligned import (
    Aligned,
    Placed,
    Policy,
    align_table,
    group_key,
    ids_in_order,
    is_labeled,
    load_alignment,
    party_view,
    place_block,
    save_alignment,
    validation_groups,
)
from .config import AGGREGATOR, Federation, load_federation
from .inputs import PartyInput, read_prediction_table, read_training_table
from .quality import lost_lines, selection_lines, still_out, trees_lines, validation_summary, validation_table
from .store import Manifest, load_weights, save_model

MODEL_RUN = "model"  # the set-up step in which a passive party names its model's training run (network.SETUP)
__all__ = ["PartyInput", "federation_program", "overlap_line", "predictions_csv", "read_inputs",
           "read_prediction_table", "read_training_table"]


def _n_classes(fed: Federation, classes: tuple[str, ...]) -> int:
    return len(classes) if fed.task == "classification" else 1


def overlap_line(fed: Federation, name: str, aligned: Aligned) -> str:
    """What this party prints after alignment: how many of its records it shares with the federation."""
    o = aligned.overlap  # (a trial read "15137 of its 15442 records are shared" as 305 records left out)
    alone = f"{o.listed - o.shared:,} by no other party" + (": they enter with its own columns alone"
                                                            if o.listed > o.shared else "")
    listed = f"lists {o.listed:,} records, {o.shared:,} also listed by another party"
    if name == fed.active:
        return f"party {name!r} (active): {listed} ({alone})"
    return f"party {name!r}: {listed}, {o.with_active:,} by the active party {fed.active!r} ({alone})"


def _stop_when_short(fed: Federation, aligned: Aligned, names: list[str]) -> None:
    """One line, at every party, when some party's records barely meet the active party's."""
    if not aligned.short:
        return
    parts = [f"party {names[s.rank]!r} and the active party {fed.active!r} both list {s.overlap} records "
             f"({100.0 * s.overlap / max(s.base, 1):.1f} % of the {s.base} records of the smaller list)"
             for s in aligned.short]
    raise InputError(f"training stopped: {'; '.join(parts)}, below [federation] min_overlap = "
                     f"{100.0 * fed.min_overlap:g} % in {fed.path}: the IDs do not line up. Make every party write "
                     "its IDs alike, or normalise them with id_pattern, id_strip_leading_zeros or id_fold_case in "
                     "[federation] (`federation check` shows each party's IDs); min_overlap = 0 trains anyway")


def _warn_when_thin(fed: Federation, aligned: Aligned, names: list[str]) -> None:
    """At the active party: a `warning:` for each party that meets under 1 % of its records where min_overlap let
    the run go on (a bad-input sweep: no overlap at all under min_overlap = 0 trained without a word)."""
    per = aligned.overlap.per_party if aligned.overlap is not None else None
    if per is None:
        return
    active = names.index(fed.active)
    for rank, (listed, _, with_active) in enumerate(per.tolist()):
        base = min(listed, per[active][0])
        if rank != active and base and with_active < 0.01 * base:
            print(f"warning: party {names[rank]!r} and the active party both list {with_active} records "
                  f"({100.0 * with_active / base:.1f} % of the smaller list): its columns reach almost no labeled "
                  "record; check that the parties write their IDs alike (`federation check`)", file=sys.stderr,
                  flush=True)


def read_inputs(fed: Federation, name: str, command: str) -> PartyInput | None:
    """Role `name`'s own files for `command`, checked (the aggregator has none)."""
    if name == AGGREGATOR:
        return None
    return read_training_table(fed, name, private=True) if command == "train" else read_prediction_table(fed, name)


def federation_program(role, config: str, command: str, options: dict):
    """The program of any role of `federation train` / `predict`: it reads its own files only (the he
    aggregator has none: it serves its protocol)."""
    fed = load_federation(config)
    if not role.is_party:
        role.network.allow_work(solo_work_units(fed.model, sized=False))  # its waits, from its own file
        role.serve_helper()
        return None
    if role.session.left_out:
        _left_out(fed, role.session.left_out)
    inputs = read_inputs(fed, role.spec.name, command)
    if command == "train":
        return _train(role, fed, inputs, options)  # (its peak memory goes into its own train_log.json)
    _predict(role, fed, inputs, options)
    return {"peak_rss_mib": peak_rss_mib()}  # for the launcher's summary (a trial missed it after a prediction)


def _same_training(role, manifest: Manifest, folder: Path) -> None:
    """Every present party's model is of one training run (its manifest's `trained_in`): each passive party
    tells the active party, which refuses a mix naming the parties (a retrain, or a run killed while the parties
    committed their folders one by one, would pair one run's encoder with another's decoder, silently); a party
    that left that run for good is named as such (its folder keeps what it had: predict without it)."""
    peers, mine = role.peers, bytes.fromhex(manifest.trained_in or "")
    if not role.is_active:
        peers.send(peers.active_index, MODEL_RUN, mine)
        return
    runs = {peers.names[k]: peers.recv(k, MODEL_RUN) for k in range(peers.n_parties) if k != peers.active_index}
    odd = [name for name, run in runs.items() if len(run) not in (0, 32)]
    if odd:
        raise Refused(f"{odd[0]} named a training run that is not a session id", odd[0])  # named to every role
    other = [name for name, run in runs.items() if run != mine]
    lost = {e["party"]: e for e in still_out(_own_record(folder).get("lost_parties", [])) if e["party"] in other}
    said = [f"{name} left the training run of this model (stage {e['stage']}, epoch {e['epoch']}) and did not "
            f"come back: predict with --absent {name}" for name, e in lost.items()]
    if stale := [name for name in other if name not in lost]:
        said.append(f"the saved model of {', '.join(stale)} is not of the training run that saved {role.spec.name}'s "
                    "(manifest.json, trained_in): train again, or restore every party's model folder from one run")
    if said:
        raise InputError("; ".join(said) + "; no predictions were written")


def _own_record(folder: Path) -> dict:
    """The active party's `train_result.json` of its saved model ({} where there is none to read)."""
    try:
        return json.loads(read_regular(Path(folder) / "train_result.json"))
    except (OSError, ValueError):
        return {}


def _left_out(fed: Federation, names: tuple[str, ...]) -> None:
    """At the active party: listed parties that did not join end the run, unless its own file consents
    (predictions from fewer parties must be asked for, never a silent fallback)."""
    waited = f"did not join within {fed.join_timeout_s:g} s"
    if fed.allow_partial_predict:
        print(f"left out ({waited}): {', '.join(names)}", file=sys.stderr, flush=True)
        return
    raise InputError(f"{', '.join(names)} {waited} (join_timeout_s in {fed.path}); predicting without "
                     f"{'it' if len(names) == 1 else 'them'} needs --absent {' '.join(names)} (or "
                     f"allow_partial_predict = true in [federation] of {fed.path}); no predictions were written")


def _train(role, fed: Federation, inputs: PartyInput, options: dict) -> None:
    """Align, encode with its own rows, train, validate, save its own part (and its own counters), staged."""
    started, name, rank = time.perf_counter(), role.spec.name, role.rank
    me, out = fed.party(name), staged(fed.party(name).model_dir)
    targets = inputs.targets if role.is_active else None
    labeled_rows = np.flatnonzero(is_labeled(targets)) if targets is not None else None
    progress = options.get("progress", False) and role.is_active
    aligned = _aligned(role, fed, inputs, labeled_rows, me.model_dir / "checkpoints", options.get("progress", False))
    print(overlap_line(fed, name, aligned), flush=True)
    _stop_when_short(fed, aligned, list(role.session.present))
    _warn_when_thin(fed, aligned, list(role.session.present))
    cfg = sized_schedule(fed.model, aligned.n, aligned.labeled.size)
    spent = _agreed_charge(role, cfg, me.model_dir, inputs.release)  # its own budget and ledger, before any sum
    n_classes = _n_classes(fed, inputs.classes) if role.is_active else None
    if role.is_active:
        print(f"schedule: stage 1 {cfg.pretrain.epochs} epochs of batch {cfg.pretrain.batch_size}, stage 2 "
              f"{cfg.train.epochs} epochs of batch {cfg.train.batch_size}", flush=True)
    placed = place_block(inputs.block, aligned)
    node, data, held_out = _host(role, fed, cfg, inputs, placed, aligned, targets, n_classes, progress)
    trained = fit(node, data, me.model_dir / "checkpoints", options.get("resume", False), progress, agree_resume(role),
                  validation=held_out, rejoin=role.rejoined_at)
    predictions = predict_split(node, held_out) if held_out is not None else None
    _save(out, node, rank, Manifest(name, inputs.encoding, fed.model.fingerprint(), fed.model.training_settings(),
                                    role.protocol.name, inputs.classes or None, inputs.target_scale,
                                    trained_in=role.session.id.hex()))
    own = {"communication": node.transport.log.table(), "protocol": role.protocol.name,
           "stage_time_s": trained.seconds, "stage_split": trained.split, "peak_rss_mib": peak_rss_mib()}
    write_json(out / "train_log.json", own)  # this party's own counters stay with it
    spent = _ledger(name, spent, me.model_dir)
    if role.is_active:
        validation, lift = _quality(fed, inputs, placed, aligned, targets, predictions, n_classes, held_out, progress)
        record = _train_record(fed, cfg, role.protocol.name, aligned, trained, own["communication"],
                               time.perf_counter() - started, validation)
        schedule = {stage: asdict(getattr(cfg, stage)) for stage in ("pretrain", "train")}
        lost = role.losses.events if role.losses is not None else []
        record = {**record, "lift": lift, "selection": trained.selection, "trees": trained.trees,
                  "schedule": schedule, "lost_parties": lost, "privacy": None if spent is None else spent.to_dict()}
        write_json(out / "train_result.json", record)
        _plot(record, out / "train_result.png")
        for line in lost_lines(lost):
            print(line, flush=True)
        _say(validation, trained.trees, lift, cfg.to_dict(), trained.selection)


def _agreed_charge(role, cfg, folder: Path, encoding=None):
    """`_charge`, once every party's own budget allows the schedule (`_budgets_agree`; with a budget only: each
    file states the same noise, part of the model's fingerprint, so every party runs that step or none)."""
    with ledger_held(cfg, role.spec.name, folder):  # no other run of this party charges between verdict and charge
        if cfg.privacy.enabled:
            seen = _exposure(cfg, role)
            _budgets_agree(role, training_refusal(cfg, role.spec.name, folder, seen))
        return _charge(role, cfg, folder, encoding, trained_in=role.session.id.hex())


def _exposure(cfg, role) -> int:
    """`privacy.exposure` of this party's rows under its run's protocol and its own file."""
    return exposure(cfg, role.protocol.hides_contributions, role.is_active, bool(role.protocol.helpers))


def _charge(role, cfg, folder: Path, encoding=None, trained_in: str | None = None):
    """Under a privacy budget: what this party's training spends after its private encoding (charged when it was
    drawn), recorded in its own ledger and refused past it; a pass's batch run again without a lost party is
    charged to it too (privacy.charge_rerun)."""
    seen = _exposure(cfg, role)  # plain: its contribution seen alone
    spent, _ = charge_training(cfg, role.spec.name, folder, seen, trained_in=trained_in)  # the run its model is of
    if encoding is not None:
        print(encoding.line(role.spec.name), flush=True)
    if spent is not None and role.losses is not None:
        role.losses.on_rerun = partial(charge_rerun, cfg, role.spec.name, folder, exposure=seen)
    return spent


BUDGET = "budget"  # the set-up step in which the parties agree that every own budget allows the schedule


def _budgets_agree(role, refusal: InputError | None, what: str = "the schedule every party sized",
                   charged: str = "this schedule") -> None:
    """Every party's own verdict on `what` (the sized schedule, or one more prediction run) reaches the active
    party, which tells each party the names of those that refuse; a refusal stops every party before any of them
    charges its ledger (privacy review: one party's refusal left the others charged for a run that never happened;
    a trial found the same of prediction runs). One bit per party crosses."""
    peers, me = role.peers, role.spec.name
    if role.is_active:
        verdicts = {peers.names[k]: peers.recv(k, BUDGET) for k in range(peers.n_parties) if k != peers.active_index}
        odd = [name for name, verdict in verdicts.items() if verdict not in (b"\x00", b"\x01")]
        if odd:
            raise Refused(f"{odd[0]} sent a budget verdict that is neither 0 nor 1", odd[0])  # named to every role
        refusing = [name for name, verdict in verdicts.items() if verdict == b"\x00"] + ([me] if refusal else [])
        for k in range(peers.n_parties):
            if k != peers.active_index:
                peers.send(k, BUDGET, ",".join(refusing).encode())
    else:
        peers.send(peers.active_index, BUDGET, b"\x00" if refusal else b"\x01")
        refusing = _refusing(peers.recv(peers.active_index, BUDGET), peers.names[:peers.n_parties])
    if refusal is not None:
        raise InputError(f"{refusal}; no party charged {charged} to its ledger")
    if refusing:
        raise InputError(f"{', '.join(refusing)}: its own privacy budget or ledger refuses {what} (its own error says "
                         f"why: one bit crosses), so every party stops here before anything is released; {me}'s "
                         f"ledger is not charged for {charged}")  # (a trial's missing ledger read as its budget)


def _refusing(payload: bytes, names: list[str]) -> list[str]:
    """The active party's answer: the refusing parties, each one of the run's parties (anything else, a helper's
    name included, ends the run)."""
    try:
        refusing = [name for name in payload.decode("ascii").split(",") if name]
    except UnicodeDecodeError:
        refusing = [""]
    if any(name not in names for name in refusing):
        raise ProtocolError("the active party's budget answer names a party that is not in the run")
    return refusing


def _say(validation: dict | None, trees: dict | None, lift: dict | None, config: dict,
         selection: dict | None = None) -> None:
    """The active party's lines after training: the validation table, the kept epoch's note, the trees, the lift
    and its warnings."""
    said = lift_lines(lift, config) if lift else []
    for line in [validation_summary(validation), *selection_lines(selection, config), *trees_lines(trees), *said]:
        print(line, flush=True)


def _save(out: Path, node, rank: int, manifest: Manifest) -> None:
    """This party's part of the model; at the active party also its trees' rows, for `predict` to refit them."""
    if node.active.present and node.active.get().trees is not None:
        node.active.get().trees.save(out)
    save_model(out, node, rank, manifest)


def _aligned(role, fed: Federation, inputs: PartyInput, labeled_rows, checkpoints: Path, say: bool) -> Aligned:
    """This party's place in the shared order: aligned with the others (a passive party keeps it with its own
    checkpoints), or, for a party that rejoins, the place it kept. `say`: on the terminal, before and after (a trial's
    50 s alignment showed nothing there)."""
    if role.rejoined_at is not None:
        return load_alignment(checkpoints, role.session.id)
    if say:
        print(f"aligning the records privately ({len(inputs.table.ids)} IDs here, {role.peers.n_parties} parties)",
              file=sys.stderr, flush=True)
    aligned = align_table(role, inputs.table.ids, inputs.block.held, labeled_rows, restrict=False,
                          policy=Policy(fed.min_overlap, fed.validation_fraction, fed.model.seed, fed.max_ids,
                                        _groups(role, fed, inputs, labeled_rows)),
                          progress=_alignment_steps(role.is_active) if say else None)
    if say:
        print(f"aligned in {aligned.seconds:.0f} s: {aligned.n} records in the shared order", file=sys.stderr,
              flush=True)
    if not role.is_active and fed.on_party_loss == "continue":
        save_alignment(checkpoints, aligned, role.session.id)
    return aligned


def _alignment_steps(active: bool) -> Callable[[str, float], None]:
    """A line on the terminal as each long step of the alignment ends (a trial waited 125 s with no sign of life)."""
    said = {"hash_and_blind": "this party's IDs hashed and blinded; every party's list now goes round the parties, "
                              "each multiplication proved",
            "lists_back": "every list came round; keying the union and proving each party's points",
            "ring": "the union " + ("went to every party" if active else "came") + "; checking every hop's proof"}

    def step(event: str, seconds: float) -> None:
        if event in said:
            print(f"  {said[event]} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    return step


def _groups(role, fed: Federation, inputs: PartyInput, labeled_rows) -> np.ndarray | None:
    """At the active party: the validation group of each row of its own table ([federation] validation_group)."""
    return validation_groups(inputs.table, labeled_rows, fed, group_key(role.key)) if role.is_active else None


def _ledger(name: str, spent, live: Path):
    """What a party's rows spent, as its live ledger now records it (with any batch a pass ran again), and its line
    (with a budget only). The ledger stays where it is charged, never staged: a copy committed with the model
    folder would undo a prediction's or a clip proposal's charge made meanwhile (review finding)."""
    if spent is None:
        return None
    entry = read_ledger(live)
    spent = replace(spent, releases=int(entry["releases_per_row"]), epsilon=float(entry["epsilon"]))
    print(f"privacy: {name} spent epsilon = {spent.epsilon:.3g} per row (delta {spent.delta:g}, {spent.releases} "
          f"releases at noise multiplier {spent.multiplier:g})", flush=True)
    return spent


def _host(role, fed: Federation, cfg, inputs: PartyInput, placed: Placed, aligned: Aligned, targets, n_classes,
          say: bool = False):
    """This party's node, its training data and validation records (the active party's with its own trees'
    score, an input of its discriminator only); `say`: a line before the own models' fits."""
    device, rank = resolve_device(cfg.device), role.rank
    role.network.allow_work(solo_work_units(cfg))  # the active party's own trees' fits come first
    model_dir = staged(fed.party(role.spec.name).model_dir)  # the rows its trees fit on join the staged model
    layout = CellLayout.from_kinds(inputs.encoding.kinds())
    scores = _own_scores(fed, cfg, model_dir, placed, aligned, targets, n_classes, role.network.advanced, say,
                         layout.groups) if role.is_active else None
    node = build_node(cfg, {rank: inputs.encoding.width}, n_classes, role.transport(device), device,
                      layouts={rank: layout},
                      own_extra=0 if scores is None else scores.shape[1])
    data = host_split(party_view(placed, aligned, rank, targets), device,
                      n_classes if fed.task == "classification" else None)
    held_out = _validation_data(placed, aligned, rank, targets, device)
    if role.is_active and node.method.survives_party_loss:  # who holds each record: a run can go on without one
        data.patterns = aligned.holders
        if held_out is not None:
            held_out.patterns = aligned.holders[aligned.validation]
    if scores is not None:
        data.own_extra = Active(torch.from_numpy(scores).to(device))
        if held_out is not None:
            held_out.own_extra = Active(torch.from_numpy(scores[aligned.validation]).to(device))
    return node, data, held_out


def _own_scores(fed: Federation, cfg, model_dir: Path, placed: Placed, aligned: Aligned, targets: np.ndarray,
                n_classes: int, each, say: bool = False, groups: tuple = ()) -> np.ndarray | None:
    """With `own_reference`: the active party's own models' scores of every record (out of fold on its labeled
    training rows; its categorical columns, `groups`, read as codes), and the rows they were fitted on kept in its
    own folder for `predict`; `each` after every fit (its progress, which the parties waiting on it see)."""
    method = method_for(cfg)
    if not method.reads_own_reference:
        return None
    y = party_view(placed, aligned, fed.names.index(fed.active), targets).labels.y
    save_own_rows(model_dir, placed, y, aligned.labeled, groups)
    if say:  # (a trial waited 3.5 minutes here with nothing on the terminal)
        print(f"fitting the active party's own models on its {aligned.labeled.size:,} labeled records, each in "
              f"{FOLDS + 1} fits (out of fold): an input of its discriminator", file=sys.stderr, flush=True)
    return own_scores(placed, y, aligned.labeled, fed.task, n_classes, cfg.seed, each=each,
                      kinds=method.own_reference_kinds, groups=groups)


def _validation_data(placed: Placed, aligned: Aligned, rank: int, targets: np.ndarray | None, device):
    """The held-out validation records as this process holds them (every party: their rounds are
    collective), or None when there are none."""
    if aligned.validation.size == 0:
        return None
    targets = targets if aligned.holders is not None else None
    return host_split(party_view(placed, aligned, rank, targets, rows=aligned.validation), device)


def _quality(fed: Federation, inputs: PartyInput, placed: Placed, aligned: Aligned, targets: np.ndarray,
             predictions, n_classes: int, held_out, say: bool = False) -> tuple[dict | None, dict | None]:
    """At the active party: the validation table and the lift over its own model on the same records (each
    counted by the parties that held it in the end: a party lost for good holds none); `say`: a line first."""
    if predictions is None:
        return None, None
    if say:  # (a trial saw 20 s of silence after the last bar)
        print("fitting the active party's own models on its own columns, for the lift", file=sys.stderr, flush=True)
    y, rows = party_view(placed, aligned, fed.names.index(fed.active), targets).labels.y, aligned.validation
    out = predictions.get().cpu().numpy()  # on the host: a party may train on its GPU
    observed = held_out.n_observed.get().cpu().numpy()
    validation = validation_table(out, y[rows], observed, fed.task, inputs.target_scale)
    groups = CellLayout.from_kinds(inputs.encoding.kinds()).groups  # its categorical columns: codes for its trees
    references = fit_reference(placed, y, aligned.labeled, rows, fed.task, n_classes, fed.model.seed, groups)
    inverse = inputs.target_scale.inverse if inputs.target_scale is not None else None
    return validation, {**lift_report(fed.task, out, references, y[rows], inverse), "classes": inputs.classes or None}


def _plot(record: dict, path: Path) -> None:
    """The record's plot; a plot that fails costs the run nothing but the plot (its models are what matter)."""
    from .plot import plot_training

    try:
        plot_training(record, path)
    except Exception as error:  # noqa: BLE001 (matplotlib's own failures are many; none should cost the models)
        print(f"warning: {path.name} not written ({type(error).__name__}: {error})", flush=True)


# `simulate`'s own settings (the data set it loads, how it draws its splits): not this run's, left out of its record
_SIMULATION_ONLY = ("dataset", "train_mechanism", "mechanism_rows", "n_labeled", "n_aligned", "max_rows",
                    "cell_missing")


def _run_settings(cfg) -> dict:
    """The settings this run trained with, as `train_result.json` records them: the schedule it ran (the `auto`
    rule's batches and epochs, not the preset's placeholders), without `simulate`'s own settings."""
    return {k: v for k, v in cfg.to_dict().items() if k not in _SIMULATION_ONLY}


def _train_record(fed: Federation, cfg, protocol: str, aligned: Aligned, trained, communication: list[dict],
                  wall: float, validation: dict | None) -> dict:
    rows = dict(zip(fed.names, aligned.holders.sum(axis=0).tolist(), strict=True))
    per_party = aligned.overlap.per_party
    overlap = {n: {"listed": int(per_party[k, 0]), "shared": int(per_party[k, 1]),
                   "with_active": int(per_party[k, 2])} for k, n in enumerate(fed.names)}
    return {"losses": trained.losses, "stage_time_s": trained.seconds, "stage_split": trained.split,
            "wall_time_s": round(wall, 3), "resumed_after_epochs": trained.resumed,  # losses and times: from there
            "protocol": protocol, "alignment": {"union_size": aligned.n + aligned.dropped, "records": aligned.n,
                                                "rows_per_party": rows, "labeled": int(aligned.labeled.size),
                                                "validation": int(aligned.validation.size),
                                                "validation_group": list(fed.validation_group),
                                                "overlap": overlap,
                                                "dropped_no_observed_party": aligned.dropped,
                                                "seconds": round(aligned.seconds, 3)},
            "validation": validation, "communication": communication, "config": _run_settings(cfg)}


def _predict(role, fed: Federation, loaded: PartyInput, options: dict) -> None:
    """Among the parties present (the world is theirs alone: records held only by absent parties simply
    have fewer holders), align the prediction tables, load this party's part, predict."""
    present = list(role.session.present)
    cfg = replace(fed.model, parties=len(present), active_party=present.index(fed.active))
    name, rank, manifest = role.spec.name, role.rank, loaded.manifest
    _same_training(role, manifest, fed.party(name).model_dir)
    aligned = align_table(role, loaded.table.ids, loaded.block.held, None, restrict=True,
                          policy=Policy(max_ids=fed.max_ids))
    print(overlap_line(fed, name, aligned), flush=True)
    device = resolve_device(cfg.device)
    n_classes = _n_classes(fed, manifest.classes or ()) if role.is_active else None
    placed, model_dir = place_block(loaded.block, aligned), fed.party(name).model_dir
    seen = _exposure(cfg, role)
    with ledger_held(cfg, name, model_dir):  # every party's own verdict first: none is charged for a refused run
        if cfg.privacy.enabled:
            _budgets_agree(role, prediction_refusal(cfg, name, model_dir, seen, trained_in=manifest.trained_in),
                           "one more prediction run", "this prediction run")
        spent = charge_prediction(cfg, name, model_dir, seen, trained_in=manifest.trained_in)  # its own budget
    if spent is not None:
        print(f"privacy: this prediction run takes {name}'s rows to epsilon = {spent.epsilon:.3g} per row of its "
              f"budget {spent.budget:g} (delta {spent.delta:g}, {spent.releases} releases at noise multiplier "
              f"{spent.multiplier:g}; charged before anything is sent)", flush=True)
        if role.losses is not None:
            role.losses.on_rerun = partial(charge_rerun, cfg, name, model_dir, exposure=seen)  # a batch run again
    kinds = method_for(cfg).own_reference_kinds
    scores = refit_scores(model_dir, placed, fed.task, n_classes, cfg.seed, kinds) \
        if role.is_active and kinds else None
    node = build_node(cfg, {rank: manifest.encoding.width}, n_classes, role.transport(device), device,
                      layouts={rank: CellLayout.from_kinds(manifest.encoding.kinds())},
                      own_extra=0 if scores is None else scores.shape[1])
    load_weights(model_dir, node, rank, manifest.weights)
    if role.is_active and node.method.fits_trees and cfg.train.epochs > 0:  # as `fit` fitted them
        node.active.get().trees = TreesHead.load(model_dir, fed.task, n_classes, cfg.seed, own_groups(node))
    keys = record_keys(node.parties[rank].randomness.secret, ids_in_order(loaded.table.ids, aligned))
    hosted = host_split(party_view(placed, aligned, rank, None, record_keys=keys), device)
    if scores is not None:
        hosted.own_extra = Active(torch.from_numpy(scores).to(device))
    predictions = predict_split(node, hosted)
    if role.is_active:
        atomic_write(staged(options["out"]), predictions_csv(loaded.table, aligned, predictions.get().cpu().numpy(),
                                                             manifest, present))


def predictions_csv(table: PartyTable, aligned: Aligned, predictions: np.ndarray, manifest: Manifest,
                    present: list[str]) -> str:
    """One row per record the active party listed, in its table's order: id (as written), prediction (in
    the target's unit for regression), parties_observed, parties (the names of the parties holding the
    record, `;`-separated) and one probability column per class; empty where no present party holds it."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    classes = manifest.classes
    probability_columns = [f"p_{c}" for c in classes] if classes else []
    writer.writerow(["id", "prediction", "parties_observed", "parties", *probability_columns])
    if not classes and manifest.target is not None:
        predictions = manifest.target.inverse(predictions)
    observed = aligned.holders.sum(axis=1)
    for row, position in enumerate(aligned.positions):
        identifier = table.raw_ids[row] if table.raw_ids else table.ids[row]
        if position < 0:
            writer.writerow([identifier, "", 0, "", *([""] * len(probability_columns))])
            continue
        holders = ";".join(present[k] for k in np.flatnonzero(aligned.holders[position]))
        if classes:  # summing to 1 to 1e-9 as written (6 decimals of float32 values: scikit-learn's log loss warned)
            p = predictions[position].astype(np.float64)
            writer.writerow([identifier, classes[int(p.argmax())], int(observed[position]), holders,
                             *(f"{v:.10f}" for v in p / p.sum())])
        else:
            writer.writerow([identifier, f"{float(predictions[position]):.6g}", int(observed[position]), holders])
    return buffer.getvalue()
