"""The alignment's star ring (secure/align.py): one party's part of it (`Ring`: the lists it sent, got and
multiplied) and the check round in which every list's origin checks it (`check_chains`, `check_order`).

The passive parties, in rank order, form a ring of m = K - 1; the active party is its hub. A passive party's own
list goes once around the passive ring (hops 1..m-1, each by the next passive party), then to the active party,
which applies the last scalar (hop m) and returns it to the list's origin. The active party's list (blinded by
a throwaway scalar of its own) goes through every passive party (hops 1..m) and back to it.

Every list is checked by its origin, end to end, in one check round after the lists (secure/dleq.py's batched
Chaum-Pedersen proofs): with weights fixed by the digests of the list it sent and the list it got back, the origin
computes M_0 from the first and Z from the second; it sends M_0 to the first party of its `check_order`, which
returns M_1 = a_1 M_0 with a proof that log_G Y_1 = log_{M_0} M_1; and so on through every other party; the last M
must be Z. So a list that comes back other than every other party's announced scalar times the list sent, point by
point and in order, is refused by its origin, whoever altered it and whoever helped (a coalition of the active party
and a passive relay included: a check by each hop's neighbours missed that one). Each ask carries the steps so far,
which the prover verifies before it multiplies, and every check frame the digest of the counts and keys its sender
was told. An origin's M_0 is its own word (as its list is): the first prover of the active party's list recomputes
it from the list it got, so that the active party, which sees every party's pseudonyms, gets no point of its
choice multiplied; a passive origin's chain starts at the active party and then runs against the ring's direction,
so no step's point can be compared with a list it relays (`check_order`), and the last is a pseudonym it cannot look
up (the union is keyed: secure/keyed.py).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import numpy as np

from . import dleq, ristretto
from .channel import Channel
from .errors import SecureMessageError

_P = ristretto.POINT_BYTES
_HOP = struct.Struct("<qqq")  # origin, hop, prover: the hop's place in the proof context


class AlignmentFrameError(SecureMessageError):
    """A received frame is malformed or a hop's proof fails: wrong type or length, counts out of range, an invalid
    point; `sender`: the rank that sent it, where the frame alone shows it (None: either of two may be wrong)."""

    def __init__(self, text: str, sender: int | None = None) -> None:
        super().__init__(text)
        self.sender = sender


class Wire:
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


def expect_length(frame: bytes, expected: int, step: str, src: int, counted: bool = False) -> None:
    """Refuse a frame whose length is not exactly what its step's schema says; `counted`: the length follows from
    another party's count as the active party announced it, so the sender is not named (either may be wrong)."""
    if len(frame) != expected:
        raise AlignmentFrameError(f"align: {step} frame from party {src} has {len(frame)} bytes, "
                                  f"expected {expected}", None if counted else src)


def passive_ring(k: int, active: int) -> list[int]:
    return [r for r in range(k) if r != active]


@dataclass
class Ring:
    """One party's part of the ring: its scalar, every party's public key, and what the check round needs: the list
    it sent and the list it got back as an origin (`sent`, `got`), and the active party's list as its first hop's
    prover received it (`made`)."""

    wire: Wire
    rank: int
    counts: np.ndarray
    publics: list[bytes]
    session: bytes
    scalar: bytes
    active: int
    threads: int = 1
    sent: dict[tuple[int, int], bytes] = field(default_factory=dict)
    got: dict[tuple[int, int], bytes] = field(default_factory=dict)
    made: dict[int, bytes] = field(default_factory=dict)
    started: tuple | None = None  # this party's check begun (`begin_check`): ([M_0], Z, digest of its list back)

    def step_context(self, origin: int, step: int, prover: int) -> bytes:
        """A check step's proof context: the session, the list's origin, the step and its prover."""
        return self.session + _HOP.pack(origin, step, prover)

    @property
    def agreed(self) -> bytes:
        """SHA-256 of the counts and public keys this party was told (every check frame carries it)."""
        return hashlib.sha256(self.session + self.counts.astype("<i8").tobytes() + b"".join(self.publics)).digest()

    def multiply(self, origin: int, index: int, points: bytes) -> bytes:
        """This party's hop `index` of `origin`'s list (its proof comes in the check round)."""
        if index == 1 and origin == self.active:
            self.made[origin] = points
        return ristretto.scalar_mult_batch(self.scalar, points, threads=self.threads)

    def send_list(self, dst: int, origin: int, index: int, points: bytes) -> None:
        """`origin`'s list after hop `index` (this party's own list kept as it left)."""
        if origin == self.rank and index == 0:
            self.sent[(origin, 1)] = points
        self.wire.send(dst, points)

    def recv_list(self, step: str, src: int, origin: int, index: int) -> bytes:
        """`origin`'s list after hop `index`: whole valid points of origin's count (kept where it is this party's own
        list back)."""
        frame = self.wire.recv(step, src)
        expect_length(frame, _P * int(self.counts[origin]), step, src, counted=True)
        bad = ristretto.first_invalid_point(frame, threads=self.threads)
        if bad >= 0:
            raise AlignmentFrameError(f"align: {step} frame from party {src}: point {bad} is not a valid "
                                      "ristretto255 point (non-canonical encoding or the identity)", src)
        if origin == self.rank and index:
            self.got[(origin, index)] = frame
        return frame


_LINK = _P + dleq.PROOF_BYTES  # one chain step: M_s and the proof that it is the prover's scalar times M_{s-1}
_D = dleq.DIGEST_BYTES


def check_order(k: int, active: int, origin: int) -> list[int]:
    """Who multiplies `origin`'s check point at each step. The active party's list: its route's order (its first prover
    recomputes M_0). A passive party's: the active party first, then the passive parties against the ring's direction
    (ring[j - 1], ..., ring[j + 1]). Scalars commute, so any order checks the list; this one gives the origin nothing
    to compare a step's point with: every step carries the active party's scalar, which no list it relays carries,
    and the passive scalars of a step (a segment ending at ring[j - 1]) always share ring[j - 1]'s with a list it
    relays (a review finding: in the route's order, a chosen M_0 came back as a relayed list's scalars times H(x),
    whether the next party holds x)."""
    ring = passive_ring(k, active)
    if origin == active:
        return ring
    j = ring.index(origin)
    return [active] + [ring[(j - t) % len(ring)] for t in range(1, len(ring))]


def check_chains(ring: Ring) -> None:
    """The check round: each origin checks that its own list came back as every other party's announced scalar
    times the list it sent, point by point. It sends M_0 (its weighted sum of the list it sent) to its first
    prover (`check_order`); step by step each prover returns M_s = a_s M_{s-1} with a proof; the origin verifies each
    and compares the last with Z, its weighted sum of the list it got back. Every ask and answer carries the digest of
    the counts and keys its sender was told, so a party told other keys is not named for a proof that fails under
    them. Raises AlignmentFrameError naming a prover whose proof fails, an origin whose ask is refused, or (no single
    sender) the suspects: of a list that came back altered, of counts or keys told differently."""
    k = len(ring.counts)
    chains = {o: check_order(k, ring.active, o) for o in range(k) if ring.counts[o] > 0}
    own = chains.get(ring.rank)
    links, z, d_final = (ring.started or _start(ring)) if own else ([], b"", b"")
    for s in range(1, k):
        if own:  # the weights' digest, M_0 and every step so far: what the prover checks before it multiplies
            ring.wire.send(own[s - 1], ring.agreed + d_final + links[0] + b"".join(links[1:]))
        for origin in (o for o, provers in sorted(chains.items()) if provers[s - 1] == ring.rank):
            ring.wire.send(origin, ring.agreed + _step(ring, origin, chains[origin], s,
                                                       ring.wire.recv(f"chain-ask{s}", origin)))
        if own:
            links.append(_verify_step(ring, own[s - 1], s, links[-1][:_P]))
    if own and links[-1][:_P] != z:
        raise AlignmentFrameError(f"align: party {ring.rank}'s list came back altered: it is not every other "
                                  "party's announced scalar times the list this party sent, point by point, in order; "
                                  f"one of parties {sorted(own)} multiplied or relayed another (each proved its step "
                                  "of the check: this party cannot tell which)")


def begin_check(ring: Ring) -> None:
    """As an origin whose list is back: its two weighted sums now (the check round uses them), if its list is not
    empty."""
    if ring.counts[ring.rank] > 0:
        ring.started = _start(ring)


def chain_context(session: bytes, origin: int) -> bytes:
    """The context of an origin's check weights (hop 0: no proof has it)."""
    return session + _HOP.pack(origin, 0, origin)


def _start(ring: Ring) -> tuple[list[bytes], bytes, bytes]:
    """As an origin: ([M_0], Z, SHA-256 of the list it got back), the weights fixed by both lists' digests."""
    sent, back = ring.sent[(ring.rank, 1)], ring.got[(ring.rank, len(ring.counts) - 1)]
    context, d_sent, d_back = chain_context(ring.session, ring.rank), dleq.digest(sent), dleq.digest(back)
    m = dleq.combine(context, d_sent, d_back, sent, ring.threads)
    return [m], dleq.combine(context, d_sent, d_back, back, ring.threads), d_back


def _step(ring: Ring, origin: int, provers: list[int], s: int, frame: bytes) -> bytes:
    """As the prover of step `s` of `origin`'s check: the ask checked (told the same counts and keys; its earlier
    steps' proofs; where the origin is the active party, which sees every party's pseudonyms, M_0 against the list
    this party got: no point of its choice), then M_s = a M_{s-1} and the proof."""
    step = f"chain-ask{s}"
    expect_length(frame, 3 * _D + _LINK * (s - 1), step, origin)
    _same_agreement(ring, frame[:_D], step, origin)
    points = [frame[2 * _D:3 * _D]] + [frame[3 * _D + _LINK * i:3 * _D + _LINK * i + _P] for i in range(s - 1)]
    proofs = [frame[3 * _D + _LINK * i + _P:3 * _D + _LINK * (i + 1)] for i in range(s - 1)]
    if not ristretto.is_valid_point(points[0]) or not all(
            dleq.verify(ring.publics[p], ring.step_context(origin, i, p), a, b, proof)
            for i, (p, a, b, proof) in enumerate(zip(provers, points, points[1:], proofs, strict=False), 1)):
        raise AlignmentFrameError(f"align: {step} frame from party {origin}: an invalid point or an earlier step's "
                                  "proof that fails", origin)
    if s == 1 and origin == ring.active:
        _check_first(ring, origin, frame[_D:2 * _D], points[0])
    return ristretto.scalar_mult(ring.scalar, points[-1]) + dleq.prove(
        ring.scalar, ring.step_context(origin, s, ring.rank), points[-1])


def _same_agreement(ring: Ring, agreed: bytes, step: str, sender: int) -> None:
    """A frame whose sender was told other counts or keys: the active party told them apart, or the sender says so
    falsely (no single sender: both are suspects; review finding: an honest prover was named for a key it never
    announced)."""
    if agreed != ring.agreed:
        raise AlignmentFrameError(f"align: {step} frame from party {sender}: it was told other counts or public keys "
                                  f"than this party (the active party {ring.active} told them apart, or party "
                                  f"{sender} says so falsely: this party cannot tell which)")


def _check_first(ring: Ring, origin: int, d_back: bytes, m: bytes) -> None:
    """As the first prover of the active party's list: M_0 must be the weighted sum of the list this party got."""
    inp = ring.made[origin]
    if m != dleq.combine(chain_context(ring.session, origin), dleq.digest(inp), d_back, inp, ring.threads):
        raise AlignmentFrameError(f"align: chain-ask1 frame from party {origin}: its M_0 is not the weighted sum of "
                                  "the list it sent (a point of its choice: refused)", origin)


def _verify_step(ring: Ring, prover: int, s: int, m: bytes) -> bytes:
    """As the origin: the prover's answer to step `s` (M_s and its proof on the M_{s-1} this party sent)."""
    step = f"chain-proof{s}"
    frame = ring.wire.recv(step, prover)
    expect_length(frame, _D + _LINK, step, prover)
    _same_agreement(ring, frame[:_D], step, prover)
    if not dleq.verify(ring.publics[prover], ring.step_context(ring.rank, s, prover), m, frame[_D:_D + _P],
                       frame[_D + _P:]):
        raise AlignmentFrameError(f"align: party {prover}'s step {s} of the check of party {ring.rank}'s list fails "
                                  "its proof (not its announced scalar times the point it was sent)", prover)
    return frame[_D:]
