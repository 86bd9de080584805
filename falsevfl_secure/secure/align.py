"""Private record alignment: the parties agree on one order of the union of their string IDs
without revealing raw IDs (a union PSI by commutative blinding on ristretto255, every blinding proved).

H(id) = ristretto255_from_hash(SHA-512(DOMAIN || session || utf8(id))), with `session` 16 public
random bytes the active party draws per alignment. Party k draws a fresh secret scalar a_k (public key
Y_k = a_k G), shuffles its IDs with a secret permutation and computes a_k H(id). The lists travel the star ring
of secure/ring.py: a passive party's list goes once around the ring of passive parties (each multiplies it by its
scalar), then the active party multiplies it last and returns it to its origin; the active party's own list
(under a throwaway scalar t) goes through every passive party and back, and the active party replaces t by its
scalar. Every list then holds its origin's pseudonyms P(id) = (a_0 ... a_{K-1}) H(id), in the origin's order.
The active party keys every pseudonym (secure/keyed.py: G(p) = k H_u(p), not multiplicative in p), sorts the union
of the keyed points by their bytes (a pseudorandom order), learns which parties hold each, and publishes the sorted
union U to every passive party with each one's own keyed points (proved); a passive party's positions are where
its keyed points sit in U. Every multiplication is proved by a batched Chaum-Pedersen proof (secure/dleq.py) that the
party it went to checks: no party can reorder, drop, swap or re-blind a list another party will use unnoticed,
and the active party cannot give a passive party pseudonyms or keyed points other than its announced keys make.
Keys and unions told differently are caught only by the passive parties' comparison of the `transcript` (every
count, every public key, U) through the active party's signed announcement (federation/aligned.py): a caller that
skips it is open to a split (two parties' rows of one record that differ, from which the active party could read
one party's contribution).

Rounds (protocols/align.toml): sizes, session, pass1..pass{K-2}, final, entry, carry, finals, keyed, union,
hop-ask, hop-answer, hop-proof. Frames are fixed-schema bytes, checked for size before use; every received point a
party computes with is decoded and checked by libsodium (the union's points are only compared). Nothing is
unpickled, and no raw ID, digest of an ID or H(id) leaves its owner: every point on the wire carries its owner's
secret scalar (the active party's list its throwaway one).

Threat model: threat_models/alignment.toml. Linking a pseudonym (or a position) to an ID that a
coalition does not hold needs all K scalars.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from . import dleq, keyed, ristretto
from .channel import Channel
from .ring import AlignmentFrameError, Ring, Wire, check_hops, expect_length, hops, passive_ring

__all__ = ["DOMAIN", "SESSION_BYTES", "Alignment", "AlignmentFrameError", "AlignmentInputError", "align",
           "group_hash", "transcript"]

DOMAIN = b"falsevfl-align-v1\x00"
SESSION_BYTES = 16
MAX_IDS = (1 << 30) // ristretto.POINT_BYTES - 1  # a list of points must fit one 1 GiB channel frame
_P = ristretto.POINT_BYTES


FRAME_SLACK = 64 << 10  # an alignment frame's headers, the pair channel's sealing, a signature
KEPT_BYTES_PER_ID = 8  # an int64 position in the `kept` announcement


def alignment_bounds(max_ids: int, parties: int) -> dict[str, int]:
    """The largest alignment frames a party's own max_ids lets a peer send it (the network's `align` and `kept`
    bounds, set as its role starts): in an `align` frame at most the published union (32 bytes per point, at most
    parties x max_ids: each party refuses a list longer than max_ids), and in `kept` the announcement's kept
    positions (8 bytes each, at most parties x max_ids) and its labeled and validation ones (disjoint, among the
    active party's at most max_ids). Before, any peer could fill 256 MiB per frame whatever max_ids."""
    points = min(int(max_ids), MAX_IDS)
    return {"align": _P * parties * points + FRAME_SLACK,
            "kept": KEPT_BYTES_PER_ID * (parties + 1) * points + FRAME_SLACK}


class AlignmentInputError(InputError):
    """The caller's own input is unusable (duplicate or non-string IDs, bad world or active index)."""


@dataclass(frozen=True, eq=False)  # arrays have no single truth value: compare fields, not results
class Alignment:
    """One party's result: the size of the shared order, the position of each of its rows in it
    (int64, in the caller's row order, -1 = not in the shared order) and, at the active party only,
    `holders[i, k]`: whether party k holds the record at position i (bool, (n_union, K)); `sizes`: every party's
    list size n_k as the session announced it (what a later check may hold a peer to); `transcript`: the digest of
    every count, every public key and the published union (`transcript`), what the passive parties compare."""

    n_union: int
    positions: np.ndarray
    holders: np.ndarray | None = None
    sizes: np.ndarray | None = None
    transcript: bytes = b""


def group_hash(session: bytes, identifier: str) -> bytes:
    """H(id): the unblinded group element of an ID (computed locally only; never sent)."""
    return ristretto.hash_to_group(DOMAIN + session + identifier.encode("utf-8"))


class _Clock:
    """Seconds per phase into `timings` (if given), measured from the previous lap; `progress(event, seconds since
    the start)` after each phase and each noted step (if given: a trial's 125 s alignment showed no sign of life)."""

    def __init__(self, timings: dict | None, progress: Callable[[str, float], None] | None = None) -> None:
        self.timings, self.progress, self.start = timings, progress, time.perf_counter()
        self.last = self.start

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
            self.timings["total"] = now - self.start
        self.last = now
        self.note(phase)

    def note(self, event: str) -> None:
        if self.progress is not None:
            self.progress(event, time.perf_counter() - self.start)


def align(channel: Channel, ids: Sequence[str], active: int, *, restrict_to_active: bool = False,
          view: list | None = None, secrets_out: dict | None = None, timings: dict | None = None,
          threads: int = 1, max_ids: int = MAX_IDS, progress: Callable[[str, float], None] | None = None) -> Alignment:
    """Align this party's `ids` with every other party's; every rank of `channel` calls it at once.

    Returns the union size N and, per own row (in the order of `ids`), its position 0..N-1 in the
    shared order; at `active` also `holders`. With `restrict_to_active`, the shared order is the
    active party's records only (N = its count) and other rows get -1. `view` (a list) receives
    {"step", "from", "payload"} for every frame this party receives. `secrets_out` (a dict; test
    hook for collusion attacks, never needed in production) receives this party's scalar, session
    and permutation (and at the active party its throwaway scalar, `entry`). `timings` (a dict) receives
    seconds per phase. `threads` > 1 spreads the group operations over that many threads (libsodium runs
    without the GIL; use idle cores only). `progress(event, seconds)` hears of each phase ("hash_and_blind", "ring",
    "hop_checks") and, at the active party, "lists_back" (every list came round). `max_ids` bounds every party's
    list: the active party learns which parties hold each ID it lists (threat_models/alignment.toml), so each party
    refuses to align with a list longer than its own bound. Raises AlignmentInputError for unusable own input
    (before anything is sent) and AlignmentFrameError for a malformed received frame, a list over the bound or a hop
    whose proof fails."""
    rank, k = _check_world(channel, active, restrict_to_active, threads)
    bound = min(int(max_ids), MAX_IDS)
    encoded = _encode_ids(ids, bound)
    wire, clock = Wire(channel, view), _Clock(timings, progress)
    scalar = ristretto.random_scalar()  # fresh per alignment; loads libsodium before anything is sent
    session, counts, publics = _agree_session(wire, rank, k, active, len(encoded), bound, ristretto.base_mult(scalar))
    order = secret_permutation(len(encoded))
    entry, key = ristretto.random_scalar(), ristretto.random_scalar()  # the active party's throwaway and union keys
    if secrets_out is not None:
        secrets_out.update(scalar=scalar, session=session, order=order.copy(),
                           **({"entry": entry, "union_key": key} if rank == active else {}))
    clock.lap("setup")
    state = Ring(wire, rank, counts, publics, session, scalar, threads, note=clock.note)
    mine = _blind_own(encoded, order, session, entry if rank == active else scalar, threads)
    clock.lap("hash_and_blind")
    if rank != active:
        _passive_lists(state, active, mine)
        found = _receive_union(state, active, restrict_to_active)
    else:
        found = _active_lists(state, active, mine, (entry, key), restrict_to_active)
    clock.lap("ring")
    check_hops(state, hops(k, active))
    clock.lap("hop_checks")
    return _result(found, order, counts, session, publics)


def transcript(session: bytes, counts: np.ndarray, publics: list[bytes], union: bytes) -> bytes:
    """SHA-256 of what every party must have been told alike: every count, every public key (the union's key last)
    and the published union
    (the passive parties compare it through the active party's signed announcement: federation/aligned.py)."""
    h = hashlib.sha256(b"falsevfl-align-transcript-v1\x00" + session + counts.astype("<i8").tobytes())
    h.update(b"".join(publics) + np.int64(len(union)).astype("<i8").tobytes())
    h.update(hashlib.sha256(union).digest())
    return h.digest()


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


def _agree_session(wire: Wire, rank: int, k: int, active: int, n: int, bound: int,
                   public: bytes) -> tuple[bytes, np.ndarray, list[bytes]]:
    """Every party's count and public key go to the active party, which returns the session bytes, all counts and
    all public keys (each party finds its own as it sent them: federation/aligned.py compares the rest)."""
    if rank != active:
        wire.send(active, np.array([n], dtype="<i8").tobytes() + public)
        frame = wire.recv("session", active)
        expect_length(frame, SESSION_BYTES + (8 + _P) * k, "session", active)
        counts = np.frombuffer(frame, dtype="<i8", offset=SESSION_BYTES, count=k).astype(np.int64)
        publics = _publics(frame[SESSION_BYTES + 8 * k:], "session", active)
        if counts.min() < 0 or counts.max() > bound or counts[rank] != n or publics[rank] != public:
            raise AlignmentFrameError(f"align: session frame from party {active} announces impossible counts, counts "
                                      f"over this party's bound or another key for it (own count {n}, announced "
                                      f"{counts[rank]}, largest {counts.max()}, max_ids {bound})", active)
        return frame[:SESSION_BYTES], counts, publics
    counts, publics = np.zeros(k, dtype=np.int64), [public] * k
    counts[rank] = n
    for src in (r for r in range(k) if r != active):
        frame = wire.recv("sizes", src)
        expect_length(frame, 8 + _P, "sizes", src)
        counts[src], publics[src] = int(np.frombuffer(frame[:8], dtype="<i8")[0]), _publics(frame[8:], "sizes", src)[0]
        if not 0 <= counts[src] <= bound:
            raise AlignmentFrameError(f"align: sizes frame from party {src} announces {counts[src]} IDs "
                                      f"(allowed 0..{bound}, max_ids)", src)
    session = secrets.token_bytes(SESSION_BYTES)  # public, fresh per alignment: pseudonyms never repeat
    for dst in (r for r in range(k) if r != active):
        wire.send(dst, session + counts.astype("<i8").tobytes() + b"".join(publics))
    return session, counts, publics


def _publics(data: bytes, step: str, src: int) -> list[bytes]:
    """Public keys Y = aG (32 bytes each), every one a valid point other than the identity."""
    keys = [data[o:o + _P] for o in range(0, len(data), _P)]
    if not all(ristretto.is_valid_point(key) for key in keys):
        raise AlignmentFrameError(f"align: {step} frame from party {src} holds a public key that is not a valid "
                                  "ristretto255 point", src)
    return keys


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


def _passive_lists(ring: Ring, active: int, own: bytes) -> None:
    """A passive party's part: its own list once around the passive ring (multiplying each list it receives), then
    to the active party; then the active party's list, multiplied on its way through."""
    members = passive_ring(len(ring.counts), active)
    j, m = members.index(ring.rank), len(members)
    origin, index, current = ring.rank, 0, own
    for p in range(1, m):
        ring.send_list(members[(j + 1) % m], origin, index, current)
        origin, index = members[(j - p) % m], p
        current = ring.multiply(origin, p, ring.recv_list(f"pass{p}", members[(j - 1) % m], origin, p - 1))
    ring.send_list(active, origin, index, current)  # its `final` (m - 1 hops: every passive scalar)
    source = active if j == 0 else members[j - 1]
    carried = ring.recv_list("entry" if j == 0 else "carry", source, active, j)
    current = ring.multiply(active, j + 1, carried)
    ring.send_list(members[j + 1] if j < m - 1 else active, active, j + 1, current)


def _active_lists(ring: Ring, active: int, own: bytes, keys: tuple[bytes, bytes], restrict: bool) -> tuple:
    """The active party's part: its own list (under its throwaway scalar) into the ring, every final back, the last
    scalar on every list (proved), the union published to every passive party."""
    members = passive_ring(len(ring.counts), active)
    m = len(members)
    ring.send_list(members[0], active, 0, own)
    lists = [b""] * len(ring.counts)
    for j, src in enumerate(members):
        origin = members[(j + 1) % m]
        lists[origin] = ring.multiply(origin, m, ring.recv_list("final", src, origin, m - 1))
    carried = ring.recv_list("carry", members[-1], active, m)
    ring.note("lists_back")
    entry, key = keys  # the union's key (secure/keyed.py): fresh per alignment, never sent
    unblind = ristretto.scalar_mul(ring.scalar, ristretto.scalar_invert(entry))  # a_A / t: the pseudonyms
    lists[active] = ristretto.scalar_mult_batch(unblind, carried, threads=ring.threads)
    hashed = [keyed.hashed(ring.session, points, ring.threads) for points in lists]
    keyed_lists = [ristretto.scalar_mult_batch(key, points, threads=ring.threads) for points in hashed]
    positions, holders, union = _shared_order(keyed_lists, ring.counts, active, restrict)
    public = ristretto.base_mult(key)
    for origin in members:
        proof = keyed.prove(key, ring.session, origin, lists[origin], hashed[origin], keyed_lists[origin], ring.threads)
        ring.wire.send(origin, lists[origin])
        ring.wire.send(origin, public + keyed_lists[origin] + proof)
        ring.wire.send(origin, union)
    return union, positions[active], holders, public


def _receive_union(ring: Ring, active: int, restrict: bool) -> tuple:
    """A passive party's finals (its own list under every scalar, proved by the active party's hop), their keyed
    points (proved: secure/keyed.py) and the keyed union; its positions are where its keyed points sit in the union
    (refused where the union is not sorted, not within the counts, or does not hold every one of a full alignment)."""
    m, n = len(ring.counts) - 1, int(ring.counts[ring.rank])
    finals = ring.recv_list("finals", active, ring.rank, m)
    frame = ring.wire.recv("keyed", active)
    expect_length(frame, _P * (n + 1) + dleq.PROOF_BYTES, "keyed", active)
    public, mine, proof = frame[:_P], frame[_P:_P * (n + 1)], frame[_P * (n + 1):]
    union = ring.wire.recv("union", active)
    low, high = (int(ring.counts[active]),) * 2 if restrict else (int(ring.counts.max()), int(ring.counts.sum()))
    points = np.frombuffer(union[:len(union) - len(union) % _P], dtype=f"S{_P}")
    if len(union) % _P or not low <= len(points) <= high or (points[1:] <= points[:-1]).any():
        raise AlignmentFrameError(f"align: union frame from party {active} has {len(union)} bytes: not {low}..{high} "
                                  "points in increasing order", active)
    if not ristretto.is_valid_point(public) or ristretto.first_invalid_point(mine) >= 0 or \
            not keyed.verify(public, ring.session, ring.rank, finals, mine, proof, ring.threads):
        raise AlignmentFrameError(f"align: keyed frame from party {active}: its keyed pseudonyms fail their proof (not "
                                  "its announced key times this party's pseudonyms, in order)", active)
    own = np.frombuffer(mine, dtype=f"S{_P}")
    at = np.searchsorted(points, own)
    found = points[np.minimum(at, max(len(points) - 1, 0))] == own if len(points) else np.zeros(n, dtype=bool)
    if not restrict and not found.all():
        raise AlignmentFrameError(f"align: union frame from party {active} is not a valid shared order (it lacks "
                                  "some of this party's records)", active)
    return union, np.where(found, at, -1).astype(np.int64), None, public


def _result(found: tuple, order: np.ndarray, counts: np.ndarray, session: bytes, publics: list[bytes]) -> Alignment:
    union, positions, holders, key = found
    return Alignment(len(union) // _P, _unshuffle(positions, order), holders, counts.copy(),
                     transcript(session, counts, [*publics, key], union))


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
                  restrict: bool) -> tuple[list[np.ndarray], np.ndarray, bytes]:
    """Positions per origin (in the origin's shuffled order), the holders matrix and the union (its sorted points)."""
    k = len(counts)
    inverse, n_union = _union(lists)
    origin = np.repeat(np.arange(k), counts)
    holders = np.zeros((n_union, k), dtype=bool)
    holders[inverse, origin] = True
    duplicated = np.flatnonzero(holders.sum(axis=0) != counts)
    if len(duplicated):  # honest lists have distinct IDs, hence distinct pseudonyms
        raise AlignmentFrameError(f"align: the list of party {int(duplicated[0])} repeats a pseudonym")
    union = np.zeros((n_union, _P), dtype=np.uint8)
    union[inverse] = np.frombuffer(b"".join(lists), dtype=np.uint8).reshape(-1, _P)
    if restrict:  # keep the active party's records, in pseudonym order
        kept = np.flatnonzero(holders[:, active])
        remap = np.full(n_union, -1, dtype=np.int64)
        remap[kept] = np.arange(len(kept))
        inverse, holders, union = remap[inverse], holders[kept], union[kept]
    return np.split(inverse, np.cumsum(counts)[:-1]), holders, union.tobytes()


def _unshuffle(shuffled: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Positions in the caller's row order: row order[i] is the i-th entry of the shuffled list."""
    result = np.empty(len(order), dtype=np.int64)
    result[order] = shuffled
    return result
