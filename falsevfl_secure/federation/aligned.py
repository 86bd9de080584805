"""From a party's own table to its share of the federation's data: align the IDs privately, then place
the party's rows at their positions in the shared order.

The alignment (`secure.align`) gives every party the position of each of its listed rows and the
active party which parties list each record. A passive party lists the rows whose features it holds;
the active party lists every row of its table, also those where it only knows a label (or wants a
prediction) without holding the features. The active party then keeps the records that some party
holds features of (the empty-row rule) and tells every party, in one frame, the kept positions and
which of them are labeled: row numbers of the shared order, never labels.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import numpy as np

from ..data import LabelSide, PartyView
from ..data.standardize import Standardizer
from ..data.tables import PartyTable
from ..secure import frames
from ..secure.align import MAX_IDS, align
from ..secure.errors import SecureMessageError
from ..secure.identity import sign, verify


@dataclass(frozen=True)
class Aligned:
    """This party's rows in the shared order (after the empty-row rule)."""

    n: int  # records in the shared order
    positions: np.ndarray  # per table row, its position (-1: not in the order)
    labeled: np.ndarray  # positions of the labeled records (public)
    holders: np.ndarray | None  # (n, K) bool at the active party: which parties hold the features
    dropped: int  # records listed by the active party that no party holds features of
    seconds: float


def align_table(role, table: PartyTable, labeled_rows: np.ndarray | None, restrict: bool,
                max_ids: int = MAX_IDS) -> Aligned:
    """Align this party's table with every other party's (a collective over the parties)."""
    started = time.perf_counter()
    listed = np.arange(table.n_rows) if role.is_active else np.flatnonzero(table.held)
    channel = role.channel()
    active = role.peers.active_index
    result = align(channel, [table.ids[i] for i in listed], active, restrict_to_active=restrict, max_ids=max_ids)
    positions = np.full(table.n_rows, -1, dtype=np.int64)
    positions[listed] = result.positions
    if role.is_active:
        holders = result.holders.copy()
        holders[:, active] = False
        holders[positions[table.held & (positions >= 0)], active] = True
        kept = np.flatnonzero(holders.any(axis=1))
        labeled = np.intersect1d(positions[labeled_rows], kept) if labeled_rows is not None else kept[:0]
        _announce(role, kept, labeled)
        holders, dropped = holders[kept], int(result.n_union - kept.size)
    else:
        (kept, labeled), holders, dropped = _announced(role, result.n_union), None, 0
    remap = np.full(result.n_union, -1, dtype=np.int64)
    remap[kept] = np.arange(kept.size)
    positions = np.where(positions >= 0, remap[np.maximum(positions, 0)], -1)
    return Aligned(int(kept.size), positions, remap[labeled], holders, dropped, time.perf_counter() - started)


def _announce(role, kept: np.ndarray, labeled: np.ndarray) -> None:
    """The declared `kept` step: the active party's signed announcement of the kept and labeled positions."""
    frame = frames.encode(frames.Kind.DATA, [kept.astype("<i8").tobytes(), labeled.astype("<i8").tobytes()])
    signature = sign(role.key, "kept rows", role.session.id + hashlib.sha256(frame).digest())
    peers = role.peers
    for rank in range(peers.n_parties):
        if rank != peers.active_index:
            peers.send(rank, "kept", signature + frame)


def _announced(role, n_union: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept and labeled positions from the active party, signed by it over this session: increasing
    positions of the shared order, the labeled ones among the kept (anything else is refused)."""
    peers, active = role.peers, role.session.active
    payload = peers.recv(peers.active_index, "kept")
    signature, frame = payload[:64], payload[64:]
    verify(role.spec.cast.pins[active], "kept rows", role.session.id + hashlib.sha256(frame).digest(), signature,
           active)
    return check_announcement(frame, peers.active_index, n_union)


def check_announcement(data: bytes, active: int, n_union: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept and labeled positions in an announcement frame, checked (see `_announced`)."""
    frame = frames.decode(data, expect=(frames.Kind.DATA,))
    if len(frame.blobs) != 2 or any(len(b) % 8 for b in frame.blobs):
        raise SecureMessageError(f"the row announcement from party {active} is not two int64 arrays")
    kept, labeled = (np.frombuffer(b, dtype="<i8").astype(np.int64) for b in frame.blobs)
    if not (_increasing_within(kept, n_union) and _increasing_within(labeled, n_union)
            and np.isin(labeled, kept).all()):
        raise SecureMessageError(f"the row announcement from party {active} names positions that are not "
                                 f"increasing positions of the shared order of {n_union} records")
    return kept, labeled


def _increasing_within(positions: np.ndarray, n: int) -> bool:
    return bool(positions.size == 0 or (positions[0] >= 0 and positions[-1] < n and (np.diff(positions) > 0).all()))


def party_view(table: PartyTable, aligned: Aligned, scaler: Standardizer, rank: int,
               targets: np.ndarray | None) -> PartyView:
    """What this party holds of the shared order: its standardised block at its positions (zeros
    elsewhere), its held rows, and at the active party the label side (targets of labeled rows)."""
    own = table.held & (aligned.positions >= 0)
    x = np.zeros((aligned.n, table.x.shape[1]), dtype=np.float32)
    x[aligned.positions[own]] = scaler.transform(table.x[own])
    held = np.zeros(aligned.n, dtype=bool)
    held[aligned.positions[own]] = True
    labels = None
    if aligned.holders is not None:
        y = np.zeros(aligned.n, dtype=np.float32 if targets is not None and targets.dtype.kind == "f" else np.int64)
        if targets is not None:
            rows = (aligned.positions >= 0) & is_labeled(targets)
            y[aligned.positions[rows]] = targets[rows]
        labels = LabelSide(aligned.holders.sum(axis=1).astype(np.int64), y)
    return PartyView(aligned.n, {rank: (x, held)}, labels, aligned.labeled)


def is_labeled(targets: np.ndarray) -> np.ndarray:
    """Which encoded targets are labels (NaN or -1 mark an unlabeled row)."""
    return ~np.isnan(targets) if targets.dtype.kind == "f" else targets >= 0
