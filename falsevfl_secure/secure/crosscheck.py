"""Every pair of passive parties checks, without telling each other which records they share, that the active
party placed each record both hold at one row of the shared order for both.

Why: the active party alone sorts the shared order and tells each party its rows (the alignment's `positions`,
then the `kept` announcement). A malicious active party could place a record that B and C both hold at two
rows, one per holder, or announce each a different list: every such row then sums one holder's value with the
active party's own, and the revealed sum is that holder's contribution (red team; threat_models/
malicious_pinned_party.toml). No passive party can see this from its own view.

The check, per pair over their sealed pair channel (the active party relays it and sees only lengths), after
the two compared the active party's signed announcements (federation/aligned.py): a private set-intersection
cardinality by commutative blinding on ristretto255 (a fresh scalar per peer) of two sets per party, every
record it listed in the alignment: X = {H(id)} and Y = {H(id, row)} (row -1: not in the order). Each sends its
blinded lists (of its count in the alignment), returns the other's reblinded and shuffled, and counts the matches
of both. An honest placement gives |X_B n X_C| = |Y_B n Y_C|; each record placed at two rows takes one from |Y n|.
What each learns: how many records the two share (|X n|; the active party knows it too), never which.
Cost per party and peer: 2n hashes (once) and 4n scalar multiplications; about 0.17 s per 1,000 records and pair
on one core. Rounds: protocols/align.toml, [[federation_rounds]] `crosscheck`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import ristretto
from .align import secret_permutation
from .channel import Channel
from .errors import SecureMessageError

DOMAIN = b"falsevfl-crosscheck-v1\x00"
_P = ristretto.POINT_BYTES


class MisplacedRecords(SecureMessageError):
    """Two passive parties' rows disagree: the active party placed a shared record at two rows, or the peer sent
    lists other than its records (neither can tell which from its own view)."""


class MalformedList(SecureMessageError):
    """A peer's list is not what the check allows (whole points, its announced count): `peer` sent it."""

    def __init__(self, text: str, peer: int) -> None:
        super().__init__(text)
        self.peer = peer


@dataclass(frozen=True)
class Agreement:
    """What one pair's check found at this party: records the two share, of them at one row for both."""

    peer: int
    shared: int
    placed_alike: int


def crosscheck(channel: Channel, peers: dict[int, str], sizes: dict[int, int], ids: Sequence[bytes],
               rows: np.ndarray, session: bytes, sender: str = "the active party") -> list[Agreement]:
    """Run the check with every rank of `peers` (rank -> name: the other passive parties, each calling this at
    once) for the records this party listed in the alignment (`ids`, UTF-8; `rows`, each one's row of the shared
    order or -1). Each peer's lists must hold `sizes[peer]` points, its count in the alignment (a peer cannot
    probe with a set of its choosing larger than its list). Raises MisplacedRecords where a shared record sits at
    two rows, MalformedList naming the peer where its list is not whole points of its count."""
    if len(ids) != len(rows):
        raise ValueError(f"crosscheck: {len(ids)} ids for {len(rows)} rows")
    hashed, found = _hashed(ids, rows, session), []
    for peer in (p for p in pair_rounds(channel.rank, peers) if p is not None):
        found.append(_cardinalities(channel, peer, hashed, int(sizes[peer])))
        split, shared = found[-1].shared - found[-1].placed_alike, found[-1].shared
        if split:  # the counts stay in this party's own message: another role reads only the error's type
            raise MisplacedRecords(f"{split} of the {shared} records this party shares with {peers[peer]!r} sit at "
                                   f"different rows for the two: {sender} placed them so (or {peers[peer]!r} sent "
                                   "lists other than its records); refused before any sum, as such rows would "
                                   "reveal one party's contribution")
    return found


def pair_rounds(me: int, peers: Sequence[int]) -> list[int | None]:
    """This party's peer in each round of a round-robin over it and `peers` (the circle method; None: it sits the
    round out): every pair meets once, the pairs of a round are disjoint (on hosts of their own they run at once),
    and every party follows the same rounds, so no wait is circular."""
    members: list[int | None] = sorted({me, *peers})
    if len(members) % 2:
        members.append(None)  # a bye
    order, n = [], len(members)
    for _ in range(n - 1):
        at = members.index(me)
        order.append(members[n - 1 - at])
        members = [members[0], members[-1], *members[1:-1]]  # the first stays, the others turn one place
    return order


def _hashed(ids: Sequence[bytes], rows: np.ndarray, session: bytes) -> tuple[bytes, bytes]:
    """H(X || id) and H(Y || id || row) for every record (the ID length-prefixed: no two pairs write alike)."""
    prefix = DOMAIN + len(session).to_bytes(2, "big") + session
    framed = [len(i).to_bytes(4, "big") + i for i in ids]
    x = ristretto.hash_to_group_batch(framed, prefix=prefix + b"X")
    rowed = (f + int(r).to_bytes(8, "big", signed=True) for f, r in zip(framed, rows, strict=True))
    y = ristretto.hash_to_group_batch(rowed, prefix=prefix + b"Y")
    return x, y


def _cardinalities(channel: Channel, peer: int, hashed: tuple[bytes, bytes], size: int) -> Agreement:
    """One pair's private set-intersection cardinality of X and of Y (both parties run it at once)."""
    scalar = ristretto.random_scalar()  # fresh per peer and check: two peers' lists never link
    mine = [_shuffled(ristretto.scalar_mult_batch(scalar, points)) for points in hashed]
    theirs = [_points(channel.exchange(peer, own, peer), peer, size) for own in mine]
    doubled = [_reblind(scalar, points, peer) for points in theirs]  # both scalars on the peer's records
    # ours with both scalars, in an order only the peer knows
    returned = [_points(channel.exchange(peer, _shuffled(points), peer), peer, len(own) // _P)
                for points, own in zip(doubled, mine, strict=True)]
    shared, alike = (_matches(ours, other) for ours, other in zip(returned, doubled, strict=True))
    return Agreement(peer, shared, alike)


def _shuffled(points: bytes) -> bytes:
    """The points in a secret order (the OS CSPRNG's permutation): the receiver cannot tell which is whose."""
    order = secret_permutation(len(points) // _P)
    return np.frombuffer(points, dtype=np.uint8).reshape(-1, _P)[order].tobytes()


def _points(frame: object, peer: int, expected: int) -> bytes:
    """A peer's list of points: bytes, `expected` whole points, no point twice (red team: a point sent i times
    comes back i times, however shuffled, naming which of its chosen IDs the other party holds)."""
    if not isinstance(frame, bytes) or len(frame) != expected * _P:
        size = len(frame) if isinstance(frame, bytes) else type(frame).__name__
        raise MalformedList(f"crosscheck: party {peer} sent a list of {size} bytes, not {expected} points", peer)
    if _repeats(frame):
        raise MalformedList(f"crosscheck: party {peer} sent a list that holds a point twice", peer)
    return frame


def _repeats(points: bytes) -> bool:
    """Whether a list of points holds one point twice."""
    return np.unique(np.frombuffer(points, dtype=f"V{_P}")).size != len(points) // _P


def _reblind(scalar: bytes, points: bytes, peer: int) -> bytes:
    try:
        return ristretto.scalar_mult_batch(scalar, points)
    except ristretto.InvalidPointError as error:
        raise MalformedList(f"crosscheck: a list from party {peer}: {error}", peer) from None


def _matches(ours: bytes, theirs: bytes) -> int:
    """How many points of `ours` appear among `theirs`."""
    a, b = (np.frombuffer(v, dtype=np.uint8).reshape(-1, _P).view(f"V{_P}").ravel() for v in (ours, theirs))
    return int(np.isin(a, b).sum())
