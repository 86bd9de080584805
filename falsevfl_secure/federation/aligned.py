"""From a party's own table to its share of the federation's data: align the IDs privately, then place
the party's rows at their positions in the shared order.

The alignment (`secure.align`) gives every party the position of each of its listed rows and the
active party which parties list each record. A passive party lists the rows whose features it holds;
the active party lists every row of its table, also those where it only knows a label (or wants a
prediction) without holding the features. The active party then keeps the records that some party
holds features of (the empty-row rule), holds out a share of the labeled ones for validation, and
tells every party, in one frame (the announcement):

- `kept`: the kept positions of the union's order (increasing);
- `labeled`: the kept positions that train stage 2 (increasing);
- `validation`: the kept positions held out to measure the model (increasing, disjoint from `labeled`);
- `counts`: for the receiving party only, [records it listed that another party lists too,
  records it listed that the active party lists too];
- `short`: (rank, overlap, base) for every party whose overlap with the active party (records both
  list, out of base = the smaller of the two lists) is below `[federation] min_overlap`: training stops.

All of it is row numbers of the shared order and counts, never labels or IDs.
"""

from __future__ import annotations

import hashlib
import io
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data import LabelSide, PartyView
from ..data.encoding import EncodedBlock
from ..data.tables import PartyTable
from ..errors import InputError
from ..fsio import atomic_write
from ..heap import give_back_freed_memory
from ..network.network import RECV_TIMEOUT_S, RunAborted
from ..network.wire import Refused
from ..randomness import PublicStream, RoleSecret, public_rng
from ..secure import frames
from ..secure.align import MAX_IDS, Alignment, AlignmentFrameError, align, alignment_bounds
from ..secure.errors import SecureMessageError
from ..secure.identity import IdentityError, sign, verify

_BLOBS = 5
GROUPS = "validation groups"  # what the active party's group key is for
GROUP_DOMAIN = b"falsevfl-groups"  # BLAKE2b's personalisation for it (at most 16 bytes)
ALIGNMENT_FILE = "alignment.npz"  # a passive party's place in the shared order, with its own checkpoints


@dataclass(frozen=True)
class Policy:
    """What the active party applies after alignment (public settings of the federation file)."""

    min_overlap: float = 0.0
    validation_fraction: float = 0.0
    seed: int = 0
    max_ids: int = MAX_IDS  # the alignment's bound on every party's list (threat_models/alignment.toml)
    groups: np.ndarray | None = None  # per row of the active party's table, its validation group's secret name


@dataclass(frozen=True)
class Shortfall:
    """A party whose records barely meet the active party's: `overlap` records both list, of `base`."""

    rank: int
    overlap: int
    base: int


@dataclass(frozen=True)
class Overlap:
    """How this party's listed records meet the federation: `shared` are also listed by another party,
    `with_active` also by the active party. At the active party `per_party` has (listed, shared,
    with_active) of every rank."""

    listed: int
    shared: int
    with_active: int
    per_party: np.ndarray | None = None


@dataclass(frozen=True)
class Aligned:
    """This party's rows in the shared order (after the empty-row rule)."""

    n: int  # records in the shared order
    positions: np.ndarray  # per table row, its position (-1: not in the order)
    labeled: np.ndarray  # positions of the labeled records that train (public)
    holders: np.ndarray | None  # (n, K) bool at the active party: which parties hold the features
    dropped: int  # records listed by the active party that no party holds features of
    seconds: float
    validation: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # held out (public)
    overlap: Overlap | None = None
    short: tuple[Shortfall, ...] = ()


def align_table(role, ids: tuple[str, ...], held: np.ndarray, labeled_rows: np.ndarray | None, restrict: bool,
                policy: Policy = Policy(), progress: Callable[[str, float], None] | None = None) -> Aligned:
    """Align this party's rows (`ids`, the normalised keys; `held`: rows holding some feature cell) with
    every other party's (a collective over the parties); `progress`: secure/align.py's."""
    started = time.perf_counter()
    active = role.peers.active_index
    listed = np.arange(len(ids)) if role.is_active else np.flatnonzero(held)
    role.network.tighten(alignment_bounds(policy.max_ids, role.peers.n_parties))
    if role.peers.n_parties > 1:
        result = _named(role, lambda: align(role.channel(), [ids[i] for i in listed], active,  # on this role's cores
                                            restrict_to_active=restrict, max_ids=policy.max_ids,
                                            threads=torch.get_num_threads(), progress=progress))
        give_back_freed_memory()
    else:  # the active party alone: nothing to align
        result = Alignment(listed.size, np.arange(listed.size), np.ones((listed.size, 1), dtype=bool))
    positions = np.full(len(ids), -1, dtype=np.int64)
    positions[listed] = result.positions
    if role.is_active:
        kept, labeled, validation, holders, overlap, short = _apply_policy(role, result, positions, held, labeled_rows,
                                                                           policy)
        dropped = int(result.n_union - kept.size)
    else:
        announced = _announced(role, result, listed.size)
        kept, labeled, validation, (shared, with_active), short, signed = announced
        holders, dropped, overlap = None, 0, Overlap(int(listed.size), int(shared), int(with_active))
    remap = np.full(result.n_union, -1, dtype=np.int64)
    remap[kept] = np.arange(kept.size)
    positions = np.where(positions >= 0, remap[np.maximum(positions, 0)], -1)
    if not role.is_active:  # before any value is summed over these rows (none, where one is short: it stops)
        _refuse_unasked_shortfall(role, short, policy)
        if not short:
            _compare_with_passive_peers(role, signed)
    return Aligned(int(kept.size), positions, remap[labeled], holders, dropped, time.perf_counter() - started,
                   remap[validation], overlap, short)


def _refuse_unasked_shortfall(role, short: tuple[Shortfall, ...], policy: Policy) -> None:
    """A shortfall stops training at every party, so none checks its rows with its peers; where this party's own
    file asks for no minimum overlap (a prediction always), an announced one is the active party's refusal (review
    finding: a shortfall signed into a prediction's announcement skipped the peers' comparison, and the run went
    on)."""
    if short and policy.min_overlap <= 0:
        active = role.peers.names[role.peers.active_index]
        raise Refused(f"{active} announced records that barely meet its own, where this party asks for no minimum "
                      "overlap: refused before any sum", active)


def _named(role, run):
    """`run()`, a frame it refuses named to every role as its sender's (review: the receiver was named failed)."""
    try:
        return run()
    except AlignmentFrameError as error:
        sender = error.sender
        if sender is None:
            raise
        name = role.peers.names[sender]
        raise Refused(str(error).replace(f"party {sender}", repr(name)), name) from None


def _apply_policy(role, result: Alignment, positions: np.ndarray, held: np.ndarray, labeled_rows: np.ndarray | None,
                  policy: Policy):
    """At the active party: the empty-row rule, the hold-out and the overlaps, announced to every party (and, where
    two or more passive parties compare what they were told, awaited from each: no round starts before)."""
    active = role.peers.active_index
    per_party = _overlaps(result.holders, active)
    holders = result.holders.copy()
    holders[:, active] = False
    holders[positions[held & (positions >= 0)], active] = True
    kept = np.flatnonzero(holders.any(axis=1))
    rows = labeled_rows[np.isin(positions[labeled_rows], kept)] if labeled_rows is not None else kept[:0]
    labeled, validation = (np.sort(positions[part]) for part in _hold_out(np.sort(rows), policy))
    short = _short(per_party, active, policy.min_overlap)
    try:
        _announce(role, kept, labeled, validation, per_party, short, result)
    except RunAborted:
        if not short:
            raise
        # told of the shortfall, a passive party stops at once, while the announcements still go out: the stop is
        # this party's own (it names the shortfall), not that party's (a race the active party lost 2 runs in 4)
    passive = _passive_peers(role) if not short else {}  # (a shortfall stops every party now: nothing to check)
    for rank in passive if len(passive) > 1 else ():  # the pairs meet in len(passive) rounds at most
        role.network.recv(role.peers.names[rank], "kept-ack", RECV_TIMEOUT_S * len(passive))
    return kept, labeled, validation, holders[kept], Overlap(*(int(v) for v in per_party[active]), per_party), short


def _passive_peers(role) -> dict[int, str]:
    """Rank -> name of every passive party present, but this role."""
    peers = role.peers
    return {r: peers.names[r] for r in range(peers.n_parties) if r not in (peers.active_index, peers.rank)}


def common_digest(session: bytes, n: int, sizes: np.ndarray | None, kept: np.ndarray, labeled: np.ndarray,
                  validation: np.ndarray, transcript: bytes = b"") -> bytes:
    """SHA-256 of what every party is told alike (N, every party's list size in the alignment, kept, labeled,
    validation, and the alignment's transcript: every public key and the published union), in the run: a size, a
    key or a union told differently shows as two signed digests."""
    h = hashlib.sha256(b"falsevfl-common-rows-v2\x00" + session + np.int64(n).astype("<i8").tobytes()
                       + len(transcript).to_bytes(8, "big") + transcript)
    for part in (np.zeros(0, np.int64) if sizes is None else sizes, kept, labeled, validation):
        h.update(np.int64(part.size).astype("<i8").tobytes() + np.asarray(part, dtype="<i8").tobytes())
    return h.digest()


def _compare_with_passive_peers(role, signed: bytes) -> None:
    """With every other passive party: compare the active party's signed common announcements (the same rows, the
    same keys, the same published union, hence one row per record for every holder: secure/align.py), then tell the
    active party, which starts no round before."""
    others = _passive_peers(role)
    if not others:
        return
    channel = role.channel()
    for peer in sorted(others):
        _same_announcement(role, signed, channel.exchange(peer, signed, peer), others[peer])
    role.peers.send(role.peers.active_index, "kept-ack", b"")


def _same_announcement(role, mine: bytes, theirs: object, peer: str) -> None:
    """A peer's common digest and the active party's signature of it against this party's own: a bad signature is
    the peer's forgery; two validly signed digests that differ are the active party's (refused, naming it)."""
    active = role.session.active
    if not isinstance(theirs, bytes) or len(theirs) != len(mine):
        raise Refused(f"{peer} sent a signed row announcement of the wrong size", peer)
    try:
        verify(role.spec.cast.pins[active], "common rows", role.session.id + theirs[:32], theirs[32:], active)
    except IdentityError:
        raise Refused(f"{peer} sent a row announcement that the active party {active!r} did not sign", peer) from None
    if theirs != mine:
        raise Refused(f"the active party {active!r} signed other rows to this party than to {peer!r}: refused, as rows "
                      "announced differently could read one party's contribution from the sums", active)


def save_alignment(folder: Path, aligned: Aligned, session: bytes) -> None:
    """A passive party's place in the shared order, kept with its own checkpoints (its own rows' positions:
    private) with the id of the run's session: a party that rejoins (`train --rejoin`) places its rows from it,
    as the alignment is a collective it cannot run again alone."""
    o, buffer = aligned.overlap, io.BytesIO()
    np.savez(buffer, n=aligned.n, positions=aligned.positions, labeled=aligned.labeled,
             validation=aligned.validation, overlap=np.array([o.listed, o.shared, o.with_active]),
             session=np.frombuffer(session, dtype=np.uint8))
    atomic_write(Path(folder) / ALIGNMENT_FILE, buffer.getvalue(), private=True)


def load_alignment(folder: Path, session: bytes) -> Aligned:
    """What `save_alignment` kept (arrays only, never objects), for the run of `session` only."""
    path = Path(folder) / ALIGNMENT_FILE
    try:
        with np.load(path, allow_pickle=False) as saved:
            fields = {k: saved[k] for k in ("n", "positions", "labeled", "validation", "overlap", "session")}
    except Exception as error:  # a foreign or damaged file: numpy raises several types here
        raise InputError(f"{path}: not an alignment this program saved ({type(error).__name__})") from None
    if fields["session"].tobytes() != session:
        raise InputError(f"--rejoin: {path} was saved in another run than the one the active party runs now: "
                         "this party cannot rejoin it (it can take part in the next run)")
    return Aligned(int(fields["n"]), fields["positions"].astype(np.int64), fields["labeled"].astype(np.int64), None,
                   0, 0.0, fields["validation"].astype(np.int64), Overlap(*(int(v) for v in fields["overlap"])))


def _overlaps(listing: np.ndarray, active: int) -> np.ndarray:
    """(K, 3) int64 per rank: records it lists, of them listed by another party too, by the active party too."""
    others = listing.sum(axis=1, keepdims=True) >= 2
    return np.stack([listing.sum(axis=0), (listing & others).sum(axis=0),
                     (listing & listing[:, [active]]).sum(axis=0)], axis=1).astype(np.int64)


def _short(per_party: np.ndarray, active: int, min_overlap: float) -> tuple[Shortfall, ...]:
    """The parties whose overlap with the active party, out of the smaller of the two lists, is below
    `min_overlap` (0 disables the check)."""
    out = []
    for rank, (listed, _, with_active) in enumerate(per_party.tolist()):
        base = min(listed, int(per_party[active, 0]))
        if rank != active and min_overlap > 0 and (base == 0 or with_active < min_overlap * base):
            out.append(Shortfall(rank, with_active, base))
    return tuple(out)


def _hold_out(rows: np.ndarray, policy: Policy) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) rows of the active party's table: a public draw of `validation_fraction` of
    its labeled rows (in table order, so one table and seed always hold out the same records), leaving at
    least one to train on."""
    count = min(int(round(policy.validation_fraction * rows.size)), max(rows.size - 1, 0))
    if count == 0:
        return rows, rows[:0]
    if policy.groups is not None:
        mask = _whole_groups(policy.groups[rows], count)
    else:
        mask = np.zeros(rows.size, dtype=bool)
        mask[public_rng(policy.seed, PublicStream.VALIDATION).permutation(rows.size)[:count]] = True
    return rows[~mask], rows[mask]


def _whole_groups(names: np.ndarray, count: int) -> np.ndarray:
    """Which rows to hold out: whole groups in the order of their names (`group_codes`: keyed by the active
    party's own secret, so an order only it knows; every party learns the held-out rows, and a public order
    would tell them which groups, hence the values), each taken where it still fits within `count` rows."""
    _, inverse, sizes = np.unique(names, return_inverse=True, return_counts=True)
    held, chosen = 0, np.zeros(sizes.size, dtype=bool)
    for group in range(sizes.size):
        if held + sizes[group] <= count:
            chosen[group], held = True, held + sizes[group]
    return chosen[inverse.reshape(-1)]


def group_key(signing_key) -> bytes:
    """The active party's key for naming its validation groups, derived from its own identity key (keyed
    BLAKE2b in a domain of its own): the same in every run, so every run holds out the same groups (a fresh
    draw per run would tell every passive party one more bit per record each run, and with them which records
    share a group); no other party can compute it."""
    return hashlib.blake2b(GROUPS.encode(), key=signing_key.private_bytes_raw(), digest_size=32,
                           person=GROUP_DOMAIN).digest()


def validation_groups(table: PartyTable, labeled: np.ndarray, fed, key: bytes | None = None) -> np.ndarray | None:
    """`group_codes` of the active party's rows for [federation] validation_group, refused where its labeled
    rows fall in fewer than 2 / validation_fraction groups: a few groups would make the held-out records an
    uneven share, and tell every party which of a few groups each labeled record is in."""
    codes = group_codes(table, fed.validation_group, fed.path, key)
    if codes is None or fed.validation_fraction == 0:
        return codes
    present, least = np.unique(codes[labeled]).size, math.ceil(2 / fed.validation_fraction)
    if present < least:
        raise InputError(f"{fed.path}: [federation] validation_group: the labeled records fall in {present} groups "
                         f"of {', '.join(fed.validation_group)}; holding out whole groups needs at least {least} at "
                         f"validation_fraction = {fed.validation_fraction:g} (fewer would tell every party which "
                         "of a few groups each labeled record is in): name finer columns or remove validation_group")
    return codes


def group_codes(table: PartyTable, columns: tuple[str, ...], path: Path, key: bytes | None = None) -> np.ndarray | None:
    """Per row of the active party's table, a 63-bit name of its combination of values in `columns`
    ([federation] validation_group; an empty cell is a value of its own): keyed BLAKE2b of the values under
    `key` (`group_key`; None: a fresh one), so a group has one name in every run, whatever else the table
    holds; None without such columns."""
    if not columns:
        return None
    unknown = [name for name in columns if name not in table.columns]
    if unknown:
        raise InputError(f"{path}: [federation] validation_group names {', '.join(map(repr, unknown))}, not a feature "
                         f"column of {table.where}; its columns are {', '.join(table.columns)}")
    values = [_values(table, name) for name in columns]
    combos, inverse = np.unique(np.stack([codes for _, codes in values], axis=1), axis=0, return_inverse=True)
    key = RoleSecret.fresh().key if key is None else key
    names = np.array([_group_name(key, [values[j][0][c] for j, c in enumerate(combo)]) for combo in combos],
                     dtype=np.int64)
    return names[inverse.reshape(-1)]


def _values(table: PartyTable, name: str) -> tuple[list[bytes], np.ndarray]:
    """One column's distinct values, each written unambiguously (text, or a number's exact hex), and each row's."""
    if name in table.text:
        uniques, codes = np.unique(np.array(["" if c is None else c for c in table.text[name]], dtype=str),
                                   return_inverse=True)
        return [b"t" + str(u).encode() for u in uniques], codes.reshape(-1)
    uniques, codes = np.unique(table.x[:, table.columns.index(name)].astype(np.float64), return_inverse=True)
    return [b"n" + float(u).hex().encode() for u in uniques], codes.reshape(-1)


def _group_name(key: bytes, values: list[bytes]) -> int:
    """A group's name: keyed BLAKE2b of its values, each length-prefixed (no two combinations write alike)."""
    data = b"".join(len(v).to_bytes(8, "big") + v for v in values)
    return int.from_bytes(hashlib.blake2b(data, key=key, digest_size=8, person=GROUP_DOMAIN).digest(), "big") >> 1


def _announce(role, kept: np.ndarray, labeled: np.ndarray, validation: np.ndarray, per_party: np.ndarray,
              short: tuple[Shortfall, ...], result: Alignment) -> None:
    """The declared `kept` step: to every party its announcement, signed by the active party over the session and
    the receiver's name, and the digest of its common part signed alone (which the passive parties compare)."""
    shortfalls = np.array([[s.rank, s.overlap, s.base] for s in short], dtype="<i8").reshape(-1)
    common = [kept.astype("<i8").tobytes(), labeled.astype("<i8").tobytes(), validation.astype("<i8").tobytes()]
    digest = common_digest(role.session.id, result.n_union, result.sizes, kept, labeled, validation, result.transcript)
    alike = digest + sign(role.key, "common rows", role.session.id + digest)  # what the passive parties compare
    peers, signed = role.peers, {}
    for rank in range(peers.n_parties):
        if rank != peers.active_index:
            counts = per_party[rank, 1:].astype("<i8").tobytes()
            frame = frames.encode(frames.Kind.DATA, [*common, counts, shortfalls.tobytes()])
            signature = sign(role.key, "kept rows", role.session.id + peers.names[rank].encode() + b"\0"
                             + hashlib.sha256(frame).digest())
            signed[rank] = signature + alike + frame
    for rank, announcement in signed.items():  # all at once: a party told of a shortfall stops at once
        peers.send(rank, "kept", announcement)


def _announced(role, result: Alignment, listed: int):
    """The announcement from the active party, its signatures checked against the active party's pin, then
    its contents (`check_announcement`); with the signed digest of its common part (compared among the passive
    parties)."""
    peers, active = role.peers, role.session.active
    payload = peers.recv(peers.active_index, "kept")
    signature, alike, frame = payload[:64], payload[64:160], payload[160:]
    verify(role.spec.cast.pins[active], "kept rows", role.session.id + role.spec.name.encode() + b"\0"
           + hashlib.sha256(frame).digest(), signature, active)
    kept, labeled, validation, counts, short = check_announcement(frame, peers.active_index, result.n_union, listed,
                                                                  peers.n_parties, f"the active party {active!r}")
    if alike[:32] != common_digest(role.session.id, result.n_union, result.sizes, kept, labeled, validation,
                                   result.transcript):
        raise SecureMessageError(f"the row announcement of the active party {active!r} signs another digest than "
                                 "its rows")
    verify(role.spec.cast.pins[active], "common rows", role.session.id + alike[:32], alike[32:], active)
    return kept, labeled, validation, counts, short, alike


def check_announcement(data: bytes, active: int, n_union: int, listed: int, world: int,
                       sender: str = "the active party"):
    """(kept, labeled, validation, counts, short) of an announcement frame, each checked: increasing
    positions of the shared order, labeled and validation disjoint among the kept, counts within this
    party's `listed` records, shortfalls of other ranks of the `world` within their base (anything else
    is refused, naming the `sender` by its name, never by its rank)."""
    source = f"the row announcement of {sender}"
    frame = frames.decode(data, expect=(frames.Kind.DATA,))
    if len(frame.blobs) != _BLOBS or any(len(b) % 8 for b in frame.blobs):
        raise SecureMessageError(f"{source} is not {_BLOBS} int64 arrays")
    kept, labeled, validation, counts, short = (np.frombuffer(b, dtype="<i8").astype(np.int64) for b in frame.blobs)
    if not (all(_increasing_within(p, n_union) for p in (kept, labeled, validation))
            and np.isin(labeled, kept).all() and np.isin(validation, kept).all()
            and not np.isin(validation, labeled).any()):
        raise SecureMessageError(f"{source} names positions that are not increasing positions of the shared "
                                 f"order of {n_union} records")
    if counts.size != 2 or counts.min() < 0 or counts.max() > listed:
        raise SecureMessageError(f"{source} gives counts {counts.tolist()} outside this party's {listed} records")
    return kept, labeled, validation, counts, _shortfalls(short, world, active, source)


def _shortfalls(values: np.ndarray, world: int, active: int, source: str) -> tuple[Shortfall, ...]:
    triples = values.reshape(-1, 3) if values.size % 3 == 0 else None
    if triples is None or not _increasing_within(triples[:, 0], world) or (triples[:, 0] == active).any() \
            or (triples[:, 1] < 0).any() or (triples[:, 1] > triples[:, 2]).any():
        raise SecureMessageError(f"{source} names shortfalls that are not (party, overlap <= base) of the other "
                                 "parties")
    return tuple(Shortfall(*(int(v) for v in row)) for row in triples)


def _increasing_within(positions: np.ndarray, n: int) -> bool:
    return bool(positions.size == 0 or (positions[0] >= 0 and positions[-1] < n and (np.diff(positions) > 0).all()))


@dataclass(frozen=True)
class Placed:
    """A party's encoded block at the shared positions: `x` (n, d) float32 (zeros where not held),
    `observed` (n, d) bool (the per-cell mask), `held` (n,) bool."""

    x: np.ndarray
    observed: np.ndarray
    held: np.ndarray


def place_block(block: EncodedBlock, aligned: Aligned) -> Placed:
    """This party's encoded rows at their positions in the shared order."""
    own = block.held & (aligned.positions >= 0)
    at = aligned.positions[own]
    x = np.zeros((aligned.n, block.x.shape[1]), dtype=np.float32)
    observed = np.zeros((aligned.n, block.x.shape[1]), dtype=bool)
    held = np.zeros(aligned.n, dtype=bool)
    x[at], observed[at], held[at] = block.x[own], block.observed[own], True
    return Placed(x, observed, held)


def party_view(placed: Placed, aligned: Aligned, rank: int, targets: np.ndarray | None,
               rows: np.ndarray | None = None, record_keys: np.ndarray | None = None) -> PartyView:
    """What this party holds of the shared order (or of its `rows` positions, in that order): its block,
    held rows and observed cells, and at the active party the label side (targets of labeled rows). With
    `rows`, every row counts as labeled (a validation set). `record_keys` (one row per record of the
    shared order, `randomness.record_keys`) makes a prediction repeatable."""
    whole = rows is None
    rows = np.arange(aligned.n) if whole else np.asarray(rows, dtype=np.int64)
    labels = None
    if aligned.holders is not None:
        y = np.zeros(aligned.n, dtype=np.float32 if targets is not None and targets.dtype.kind == "f" else np.int64)
        if targets is not None:
            have = (aligned.positions >= 0) & is_labeled(targets)
            y[aligned.positions[have]] = targets[have]
        labels = LabelSide(aligned.holders.sum(axis=1).astype(np.int64)[rows], y[rows])
    labeled = aligned.labeled if whole else np.arange(rows.size)
    keys = None if record_keys is None else record_keys[rows]
    return PartyView(rows.size, {rank: (placed.x[rows], placed.held[rows])}, labels, labeled,
                     observed={rank: placed.observed[rows]}, record_keys=keys)


def ids_in_order(ids: tuple[str, ...], aligned: Aligned) -> list[str | None]:
    """The normalised ID of each record of the shared order that this party lists, None elsewhere (at the
    active party in a prediction: every record). For per-record keys (`randomness.record_keys`); the IDs
    stay with this party."""
    out: list[str | None] = [None] * aligned.n
    for row in np.flatnonzero(aligned.positions >= 0):
        out[aligned.positions[row]] = ids[row]
    return out


def is_labeled(targets: np.ndarray) -> np.ndarray:
    """Which encoded targets are labels (NaN or -1 mark an unlabeled row)."""
    return ~np.isnan(targets) if targets.dtype.kind == "f" else targets >= 0
