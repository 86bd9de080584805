"""Private record alignment: the parties agree on one order of the union of their string IDs
without revealing raw IDs (a union PSI by commutative blinding on ristretto255).

H(id) = ristretto255_from_hash(SHA-512(DOMAIN || session || utf8(id))), with `session` 16 public
random bytes the active party draws per alignment. Party k draws a fresh secret scalar a_k, shuffles
its IDs with a secret permutation and computes a_k H(id). In K - 1 ring passes every party sends
its current list to party k + 1, receives one from party k - 1 and multiplies every point by a_k.
Afterwards the list that party o started has been blinded by all K scalars, (a_0 ... a_{K-1}) H(id),
and sits at party o - 1, which sends it (tagged with o, in o's order) to the active party. The
active party sorts the union of these pseudonyms by their bytes (a pseudorandom order), learns
which parties hold each position, and sends every party the positions of its own (shuffled) list.

Rounds (see protocols/align.toml): sizes (every party -> active: its count), session (active ->
every party: session bytes and all counts), pass1..pass{K-1} (k -> k + 1: n * 32 point bytes),
final (k -> active: origin int64 + n * 32 point bytes), positions (active -> every party: N int64 +
n int64 positions). Frames are fixed-schema bytes, checked for size before use; every received
point is decoded and checked by libsodium. Nothing is unpickled, and no raw ID, digest of an ID or
H(id) leaves its owner: every point on the wire carries the owner's secret scalar.

Threat model: threat_models/alignment.toml. Linking a pseudonym (or a position) to an ID that a
coalition does not hold needs all K scalars.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from . import ristretto
from .channel import Channel
from .errors import SecureMessageError

__all__ = ["DOMAIN", "SESSION_BYTES", "Alignment", "AlignmentFrameError", "AlignmentInputError", "align",
           "group_hash"]

DOMAIN = b"falsevfl-align-v1\x00"
SESSION_BYTES = 16
MAX_IDS = (1 << 30) // ristretto.POINT_BYTES - 1  # a list of points must fit one 1 GiB channel frame
_P = ristretto.POINT_BYTES


FRAME_SLACK = 64 << 10  # an alignment frame's headers, the pair channel's sealing, a signature
KEPT_BYTES_PER_ID = 8  # an int64 position in the `kept` announcement


def alignment_bounds(max_ids: int, parties: int) -> dict[str, int]:
    """The largest alignment frames a party's own max_ids lets a peer send it (the network's `align` and `kept`
    bounds, set as its role starts): one list of points (32 bytes each, at most max_ids: each party refuses a
    longer one) per `align` frame, and in `kept` the announcement's kept positions (8 bytes each, at most parties
    x max_ids) and its labeled and validation ones (disjoint, among the active party's at most max_ids). Before,
    any peer could fill 256 MiB per frame whatever max_ids."""
    points = min(int(max_ids), MAX_IDS)
    return {"align": _P * points + FRAME_SLACK, "kept": KEPT_BYTES_PER_ID * (parties + 1) * points + FRAME_SLACK}


class AlignmentInputError(InputError):
    """The caller's own input is unusable (duplicate or non-string IDs, bad world or active index)."""


class AlignmentFrameError(SecureMessageError):
    """A received frame is malformed: wrong type or length, counts out of range, an invalid point; `sender`: the
    rank that sent it, where the frame alone shows it (None: a list it relayed may have been another's doing)."""

    def __init__(self, text: str, sender: int | None = None) -> None:
        super().__init__(text)
        self.sender = sender


@dataclass(frozen=True, eq=False)  # arrays have no single truth value: compare fields, not results
class Alignment:
    """One party's result: the size of the shared order, the position of each of its rows in it
    (int64, in the caller's row order, -1 = not in the shared order) and, at the active party only,
    `holders[i, k]`: whether party k holds the record at position i (bool, (n_union, K)); `sizes`: every party's
    list size n_k as the session announced it (what a later check may hold a peer to)."""

    n_union: int
    positions: np.ndarray
    holders: np.ndarray | None = None
    sizes: np.ndarray | None = None


def group_hash(session: bytes, identifier: str) -> bytes:
    """H(id): the unblinded group element of an ID (computed locally only; never sent)."""
    return ristretto.hash_to_group(DOMAIN + session + identifier.encode("utf-8"))


class _Wire:
    """The channel plus the view: every received frame is type-checked and recorded as received."""

    def __init__(self, channel: Channel, view: list | None) -> None:
        self.channel, self.view = channel, view

    def _got(self, step: str, src: int, frame: object) -> bytes:
        """Record a received frame; refuse anything that is not bytes (e.g. an object to unpickle)."""
        if not isinstance(frame, bytes):
            raise AlignmentFrameError(f"align: {step} frame from party {src} is {type(frame).__name__}, not bytes", src)
        if self.view is not None:
            self.view.append({"step": step, "from": src, "payload": frame})
        return frame

    def send(self, dst: int, payload: bytes) -> None:
        self.channel.send(dst, payload)

    def recv(self, step: str, src: int) -> bytes:
        return self._got(step, src, self.channel.recv(src))

    def exchange(self, step: str, dst: int, payload: bytes, src: int) -> bytes:
        return self._got(step, src, self.channel.exchange(dst, payload, src))


class _Clock:
    """Seconds per phase into `timings` (if given), measured from the previous lap."""

    def __init__(self, timings: dict | None) -> None:
        self.timings, self.start = timings, time.perf_counter()
        self.last = self.start

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
            self.timings["total"] = now - self.start
        self.last = now


def align(channel: Channel, ids: Sequence[str], active: int, *, restrict_to_active: bool = False,
          view: list | None = None, secrets_out: dict | None = None, timings: dict | None = None,
          threads: int = 1, max_ids: int = MAX_IDS) -> Alignment:
    """Align this party's `ids` with every other party's; every rank of `channel` calls it at once.

    Returns the union size N and, per own row (in the order of `ids`), its position 0..N-1 in the
    shared order; at `active` also `holders`. With `restrict_to_active`, the shared order is the
    active party's records only (N = its count) and other rows get -1. `view` (a list) receives
    {"step", "from", "payload"} for every frame this party receives. `secrets_out` (a dict; test
    hook for collusion attacks, never needed in production) receives this party's scalar, session
    and permutation. `timings` (a dict) receives seconds per phase. `threads` > 1 spreads the
    group operations over that many threads (libsodium runs without the GIL; use idle cores only); they
    are the cost (every party hashes its list and multiplies all K lists, ~50 us per product), and the
    active party's check of the final lists, once the ring is done, is the one stretch where the others wait.
    `max_ids` bounds every party's list: the active party learns which parties hold each ID it lists
    (threat_models/alignment.toml), so each party refuses to align with a list longer than its own bound.
    Raises AlignmentInputError for unusable own input (before anything is sent) and
    AlignmentFrameError for a malformed received frame or a list over the bound."""
    rank, k = _check_world(channel, active, restrict_to_active, threads)
    encoded = _encode_ids(ids, min(int(max_ids), MAX_IDS))
    wire, clock = _Wire(channel, view), _Clock(timings)
    scalar = ristretto.random_scalar()  # fresh per alignment; loads libsodium before anything is sent
    session, counts = _agree_session(wire, rank, k, active, len(encoded), min(int(max_ids), MAX_IDS))
    order = secret_permutation(len(encoded))
    if secrets_out is not None:
        secrets_out.update(scalar=scalar, session=session, order=order.copy())
    clock.lap("setup")
    mine = _blind_own(encoded, order, session, scalar, threads)
    clock.lap("hash_and_blind")
    blinded = _ring_passes(wire, mine, scalar, counts, rank, threads)
    clock.lap("ring")
    if rank != active:
        wire.send(active, _final_frame((rank + 1) % k, blinded))
        result = _conclude_passive(wire, rank, active, counts, order, restrict_to_active)
    else:
        result = _conclude_active(wire, blinded, counts, order, active, restrict_to_active, threads)
    clock.lap("union_and_positions")
    return result


def _check_world(channel: Channel, active: int, restrict: bool, threads: int) -> tuple[int, int]:
    """(rank, K) of a usable world: K >= 2, 0 <= rank, active < K, plain ints and bool, threads >= 1."""
    rank, k = getattr(channel, "rank", None), getattr(channel, "world_size", None)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, k, active)):
        raise AlignmentInputError(f"align: rank, world_size and active must be ints, got {rank!r}, {k!r}, {active!r}")
    if k < 2 or not 0 <= rank < k or not 0 <= active < k:
        raise AlignmentInputError(f"align: needs 2 or more parties with 0 <= rank, active < K; got rank {rank}, "
                                  f"K {k}, active {active}")
    if not isinstance(restrict, bool):
        raise AlignmentInputError(f"align: restrict_to_active must be a bool, got {restrict!r}")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise AlignmentInputError(f"align: threads must be an int >= 1, got {threads!r}")
    return rank, k


def _encode_ids(ids: Sequence[str], bound: int) -> list[bytes]:
    """UTF-8 of every ID; refuses non-strings, unencodable strings and duplicates (by row index only,
    so that an error message never carries an ID), and more than `bound` IDs."""
    if isinstance(ids, str | bytes) or not hasattr(ids, "__len__"):
        raise AlignmentInputError(f"align: ids must be a sequence of strings, got {type(ids).__name__}")
    if len(ids) > bound:
        raise AlignmentInputError(f"align: {len(ids)} IDs exceed the bound of {bound} per party (max_ids)")
    encoded = []
    for row, identifier in enumerate(ids):
        if not isinstance(identifier, str):
            raise AlignmentInputError(f"align: the ID in row {row} is a {type(identifier).__name__}, not a str")
        try:
            encoded.append(identifier.encode("utf-8"))
        except UnicodeEncodeError:
            raise AlignmentInputError(f"align: the ID in row {row} is not encodable as UTF-8") from None
    if len(set(encoded)) != len(encoded):
        first: dict[bytes, int] = {}
        row = next(i for i, e in enumerate(encoded) if first.setdefault(e, i) != i)
        raise AlignmentInputError(f"align: duplicate ID: row {row} repeats the ID of row {first[encoded[row]]}")
    return encoded


def _agree_session(wire: _Wire, rank: int, k: int, active: int, n: int, bound: int) -> tuple[bytes, np.ndarray]:
    """Every party's count goes to the active party, which returns the session bytes and all counts."""
    if rank != active:
        wire.send(active, np.array([n], dtype="<i8").tobytes())
        frame = wire.recv("session", active)
        _expect_length(frame, SESSION_BYTES + 8 * k, "session", active)
        counts = np.frombuffer(frame, dtype="<i8", offset=SESSION_BYTES).astype(np.int64)
        if counts.min() < 0 or counts.max() > bound or counts[rank] != n:
            raise AlignmentFrameError(f"align: session frame from party {active} announces impossible counts or "
                                      f"counts over this party's bound (own count {n}, announced {counts[rank]}, "
                                      f"largest {counts.max()}, max_ids {bound})", active)
        return frame[:SESSION_BYTES], counts
    counts = np.zeros(k, dtype=np.int64)
    counts[rank] = n
    for src in (r for r in range(k) if r != active):
        frame = wire.recv("sizes", src)
        _expect_length(frame, 8, "sizes", src)
        counts[src] = int(np.frombuffer(frame, dtype="<i8")[0])
        if not 0 <= counts[src] <= bound:
            raise AlignmentFrameError(f"align: sizes frame from party {src} announces {counts[src]} IDs "
                                      f"(allowed 0..{bound}, max_ids)", src)
    session = secrets.token_bytes(SESSION_BYTES)  # public, fresh per alignment: pseudonyms never repeat
    for dst in (r for r in range(k) if r != active):
        wire.send(dst, session + counts.astype("<i8").tobytes())
    return session, counts


def _expect_length(frame: bytes, expected: int, step: str, src: int, counted: bool = False) -> None:
    """Refuse a frame whose length is not exactly what its step's schema says; `counted`: the length follows from
    another party's count as the active party announced it, so the sender is not named (either may be wrong)."""
    if len(frame) != expected:
        raise AlignmentFrameError(f"align: {step} frame from party {src} has {len(frame)} bytes, "
                                  f"expected {expected}", None if counted else src)


def secret_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of 0..n-1 from the OS CSPRNG (never a seeded generator): the order
    of n random 64-bit keys, drawn again in the rare case of a tie (distinct i.i.d. keys order uniformly)."""
    while True:
        keys = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64)
        order = np.argsort(keys)
        if n < 2 or (keys[order[1:]] != keys[order[:-1]]).all():
            return order.astype(np.int64)


def _blind_own(encoded: list[bytes], order: np.ndarray, session: bytes, scalar: bytes, threads: int = 1) -> bytes:
    """a_k H(id) for the own IDs in the secret order (n * 32 bytes)."""
    points = ristretto.hash_to_group_batch((encoded[i] for i in order), prefix=DOMAIN + session, threads=threads)
    return ristretto.scalar_mult_batch(scalar, points, threads=threads)


def _ring_passes(wire: _Wire, mine: bytes, scalar: bytes, counts: np.ndarray, rank: int, threads: int) -> bytes:
    """K - 1 passes along the ring; returns the fully blinded list of origin rank + 1 (its order kept)."""
    k, current = len(counts), mine
    for p in range(1, k):
        src, step = (rank - 1) % k, f"pass{p}"
        frame = wire.exchange(step, (rank + 1) % k, current, src)
        _expect_length(frame, _P * int(counts[(rank - p) % k]), step, src, counted=True)
        current = _reblind(frame, scalar, step, src, threads)
    return current


def _reblind(frame: bytes, scalar: bytes, step: str, src: int, threads: int) -> bytes:
    """scalar * every received point; libsodium decodes (validates) each one and refuses the identity."""
    try:
        return ristretto.scalar_mult_batch(scalar, frame, threads=threads)
    except ristretto.InvalidPointError as exc:
        raise AlignmentFrameError(f"align: {step} frame from party {src}: {exc}", src) from None


def _final_frame(origin: int, points: bytes) -> bytes:
    """The fully blinded list of `origin`, tagged with it: int64 origin + n * 32 point bytes."""
    return np.array([origin], dtype="<i8").tobytes() + points


def _receive_finals(wire: _Wire, own_final: bytes, counts: np.ndarray, active: int, threads: int) -> list[bytes]:
    """Every origin's fully blinded list at the active party, checked (tag, length, points)."""
    k = len(counts)
    lists = [b""] * k
    lists[(active + 1) % k] = own_final
    for src in (r for r in range(k) if r != active):
        frame, origin = wire.recv("final", src), (src + 1) % k
        _expect_length(frame, 8 + _P * int(counts[origin]), "final", src, counted=True)
        if int(np.frombuffer(frame[:8], dtype="<i8")[0]) != origin:
            raise AlignmentFrameError(f"align: final frame from party {src} is not tagged with origin {origin}", src)
        bad = ristretto.first_invalid_point(frame[8:], threads=threads)
        if bad >= 0:
            raise AlignmentFrameError(f"align: final frame from party {src}: point {bad} is not a valid "
                                      "ristretto255 point (non-canonical encoding or the identity)", src)
        lists[origin] = frame[8:]
    return lists


def _union(lists: list[bytes]) -> tuple[np.ndarray, int]:
    """(index of every point in the sorted distinct pseudonyms, number of distinct pseudonyms)."""
    keys = np.frombuffer(b"".join(lists), dtype=">u8").reshape(-1, 4)  # big-endian words sort as the bytes do
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64), 0
    head = keys[:, 0].astype(np.uint64)  # native words: numpy's fastest sort
    order = np.argsort(head)
    ranked = keys[order]
    differ = (ranked[1:] != ranked[:-1]).any(axis=1)
    if (differ & (ranked[1:, 0] == ranked[:-1, 0])).any():  # first 8 bytes tie, rest differ: sort by all 32
        order = np.lexsort(keys.T[::-1])  # lexsort's last key is the primary one
        ranked = keys[order]
        differ = (ranked[1:] != ranked[:-1]).any(axis=1)
    fresh = np.concatenate([[True], differ])
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[order] = np.cumsum(fresh) - 1
    return inverse, int(fresh.sum())


def _shared_order(lists: list[bytes], counts: np.ndarray, active: int,
                  restrict: bool) -> tuple[list[np.ndarray], np.ndarray]:
    """Positions per origin (in the origin's shuffled order) and the holders matrix."""
    k = len(counts)
    inverse, n_union = _union(lists)
    origin = np.repeat(np.arange(k), counts)
    holders = np.zeros((n_union, k), dtype=bool)
    holders[inverse, origin] = True
    duplicated = np.flatnonzero(holders.sum(axis=0) != counts)
    if len(duplicated):  # honest lists have distinct IDs, hence distinct pseudonyms
        raise AlignmentFrameError(f"align: the list of party {int(duplicated[0])} repeats a pseudonym")
    if restrict:  # keep the active party's records, in pseudonym order
        kept = np.flatnonzero(holders[:, active])
        remap = np.full(n_union, -1, dtype=np.int64)
        remap[kept] = np.arange(len(kept))
        inverse, holders = remap[inverse], holders[kept]
    return np.split(inverse, np.cumsum(counts)[:-1]), holders


def _conclude_active(wire: _Wire, own_final: bytes, counts: np.ndarray, order: np.ndarray, active: int,
                     restrict: bool, threads: int) -> Alignment:
    """Union, holders, positions to every party; the active party's own result."""
    lists = _receive_finals(wire, own_final, counts, active, threads)
    positions, holders = _shared_order(lists, counts, active, restrict)
    n = len(holders)
    for dst in (r for r in range(len(counts)) if r != active):
        wire.send(dst, np.concatenate([[n], positions[dst]]).astype("<i8").tobytes())
    return Alignment(n, _unshuffle(positions[active], order), holders, counts.copy())


def _conclude_passive(wire: _Wire, rank: int, active: int, counts: np.ndarray, order: np.ndarray,
                      restrict: bool) -> Alignment:
    """Receive N and the positions of the own list; check they can be a valid shared order."""
    frame = wire.recv("positions", active)
    _expect_length(frame, 8 * (1 + int(counts[rank])), "positions", active)
    values = np.frombuffer(frame, dtype="<i8").astype(np.int64)
    n, positions = int(values[0]), values[1:]
    low = int(counts[active]) if restrict else int(counts.max())
    high = int(counts[active]) if restrict else int(counts.sum())
    held = positions[positions >= 0]
    if not low <= n <= high or positions.min(initial=0) < (-1 if restrict else 0) or held.max(initial=-1) >= n \
            or len(np.unique(held)) != len(held):
        raise AlignmentFrameError(f"align: positions frame from party {active} is not a valid shared order "
                                  f"(N {n}, allowed {low}..{high}; positions must be distinct and in range)", active)
    return Alignment(n, _unshuffle(positions, order), None, counts.copy())


def _unshuffle(shuffled: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Positions in the caller's row order: row order[i] is the i-th entry of the shuffled list."""
    result = np.empty(len(order), dtype=np.int64)
    result[order] = shuffled
    return result
