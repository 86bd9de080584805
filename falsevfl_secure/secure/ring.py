"""The alignment's star ring (secure/align.py): where each blinded list goes, who multiplies it, who proves
each multiplication and who checks each proof.

The passive parties, in rank order, form a ring of m = K - 1; the active party is its hub. A passive party's own
list goes once around the passive ring (hops 1..m-1, each by the next passive party), then to the active party,
which applies the last scalar (hop m) and returns it to the list's origin. The active party's list (blinded by
a throwaway scalar of its own) goes through every passive party (hops 1..m) and back to it.

Every hop is proved (secure/dleq.py) in one check round after the lists: the party that received a hop's
output (V) sends the digest of it to the party that sent the hop's input (Q); Q answers V and the hop's prover R
with the digests of both lists and M, its weighted sum of the input; R checks the digests against the lists it
multiplied and proves on that M (so it computes no weighted sum of its own, except where Q is V too: two parties
in all, where Q would keep a proof on a point of its choice); V computes Z from the output it holds and verifies
R's proof against R's announced public key. Neither V nor Q sees the other's list. Where V and
Q are one party (two parties in all), it asks no one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
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


@dataclass(frozen=True)
class Hop:
    """The `index`-th multiplication of `origin`'s list: by `prover`, of the list `source` sent it; `receiver` gets
    the result (and checks the proof)."""

    origin: int
    index: int
    prover: int
    source: int
    receiver: int


def passive_ring(k: int, active: int) -> list[int]:
    return [r for r in range(k) if r != active]


def hops(k: int, active: int) -> list[Hop]:
    """Every proved hop of a run, in one order that every party follows in the check round."""
    ring, m, out = passive_ring(k, active), k - 1, []
    for j, origin in enumerate(ring):
        for h in range(1, m + 1):
            prover = ring[(j + h) % m] if h < m else active
            receiver = origin if h == m else (active if h == m - 1 else ring[(j + h + 1) % m])
            out.append(Hop(origin, h, prover, ring[(j + h - 1) % m], receiver))
    for h in range(1, m + 1):
        out.append(Hop(active, h, ring[h - 1], active if h == 1 else ring[h - 2], ring[h] if h < m else active))
    return out


@dataclass
class Ring:
    """One party's part of the ring: its scalar, every party's public key, the lists it sent (as some hop's source),
    those it received (as some hop's receiver) and the input and digests of each hop it made (as its prover)."""

    wire: Wire
    rank: int
    counts: np.ndarray
    publics: list[bytes]
    session: bytes
    scalar: bytes
    threads: int = 1
    sent: dict[tuple[int, int], bytes] = field(default_factory=dict)
    got: dict[tuple[int, int], bytes] = field(default_factory=dict)
    made: dict[tuple[int, int], tuple[bytes, bytes]] = field(default_factory=dict)  # (input, its digest + out's)
    note: Callable[[str], None] = lambda event: None  # a step of the ring done (the caller's progress line)

    def context(self, hop: Hop) -> bytes:
        return self.session + _HOP.pack(hop.origin, hop.index, hop.prover)

    def multiply(self, origin: int, index: int, points: bytes) -> bytes:
        """This party's hop `index` of `origin`'s list (its proof comes in the check round)."""
        out = ristretto.scalar_mult_batch(self.scalar, points, threads=self.threads)
        self.made[(origin, index)] = points, dleq.digest(points) + dleq.digest(out)
        return out

    def send_list(self, dst: int, origin: int, index: int, points: bytes) -> None:
        """`origin`'s list after hop `index`; kept as the next hop's input."""
        self.sent[(origin, index + 1)] = points
        self.wire.send(dst, points)

    def recv_list(self, step: str, src: int, origin: int, index: int) -> bytes:
        """`origin`'s list after hop `index`: whole valid points of origin's count (kept where a hop made it)."""
        frame = self.wire.recv(step, src)
        expect_length(frame, _P * int(self.counts[origin]), step, src, counted=True)
        bad = ristretto.first_invalid_point(frame, threads=self.threads)
        if bad >= 0:
            raise AlignmentFrameError(f"align: {step} frame from party {src}: point {bad} is not a valid "
                                      "ristretto255 point (non-canonical encoding or the identity)", src)
        if index:
            self.got[(origin, index)] = frame
        return frame


_PART = 2 * dleq.DIGEST_BYTES + _P  # the input's digest, the output's digest, M


def check_hops(ring: Ring, schedule: list[Hop]) -> None:
    """The check round: the receiver V of each hop tells the party Q that sent its input the digest of what it
    received; Q answers V and the prover with both digests and M; the prover proves on that M; V verifies. Raises
    AlignmentFrameError naming the prover of a hop whose proof fails (an empty list has nothing to check)."""
    me, schedule = ring.rank, [h for h in schedule if ring.counts[h.origin] > 0]
    for source, group in _grouped([h for h in schedule if h.receiver == me != h.source], "source").items():
        ring.wire.send(source, b"".join(dleq.digest(ring.got[(h.origin, h.index)]) for h in group))
    answers = _answer(ring, [h for h in schedule if h.source == me])
    for source in sorted({h.source for h in schedule if me in (h.receiver, h.prover) and h.source != me}):
        mine = [h for h in schedule if h.source == source and me in (h.receiver, h.prover)]
        frame = ring.wire.recv("hop-answer", source)
        expect_length(frame, _PART * len(mine), "hop-answer", source)
        answers.update({h: frame[_PART * i:_PART * (i + 1)] for i, h in enumerate(mine)})
    for receiver, group in _grouped([h for h in schedule if h.prover == me], "receiver").items():
        ring.wire.send(receiver, b"".join(_prove(ring, h, answers[h]) for h in group))
    for prover, group in _grouped([h for h in schedule if h.receiver == me], "prover").items():
        frame = ring.wire.recv("hop-proof", prover)
        expect_length(frame, dleq.PROOF_BYTES * len(group), "hop-proof", prover)
        for i, h in enumerate(group):
            _verify(ring, h, answers[h], frame[dleq.PROOF_BYTES * i:dleq.PROOF_BYTES * (i + 1)])


def _grouped(selected: list[Hop], by: str) -> dict[int, list[Hop]]:
    groups: dict[int, list[Hop]] = {}
    for h in selected:
        groups.setdefault(getattr(h, by), []).append(h)
    return dict(sorted(groups.items()))


def _answer(ring: Ring, fed: list[Hop]) -> dict[Hop, bytes]:
    """As the source Q of the hops `fed`: each receiver's ask read, M computed, one frame to every receiver and
    prover; returns the parts this party keeps (where it is the receiver too: two parties in all)."""
    asked = {}
    for receiver, group in _grouped([h for h in fed if h.receiver != ring.rank], "receiver").items():
        frame = ring.wire.recv("hop-ask", receiver)
        expect_length(frame, dleq.DIGEST_BYTES * len(group), "hop-ask", receiver)
        asked.update({h: frame[32 * i:32 * i + 32] for i, h in enumerate(group)})
    parts, frames = {}, {}
    for h in fed:
        inp = ring.sent[(h.origin, h.index)]
        out = asked.get(h) or dleq.digest(ring.got[(h.origin, h.index)])
        parts[h] = dleq.digest(inp) + out + dleq.combine(ring.context(h), dleq.digest(inp), out, inp, ring.threads)
        for dst in {h.receiver, h.prover} - {ring.rank}:
            frames.setdefault(dst, []).append(parts[h])
    for dst in sorted(frames):
        ring.wire.send(dst, b"".join(frames[dst]))
    return {h: part for h, part in parts.items() if h.receiver == ring.rank}


def _prove(ring: Ring, hop: Hop, part: bytes) -> bytes:
    """This party's proof of a hop it made, on the M its input's sender computed (for the lists it multiplied)."""
    inp, digests = ring.made[(hop.origin, hop.index)]
    if part[:2 * dleq.DIGEST_BYTES] != digests:  # Q's word, or V's passed on by Q
        raise AlignmentFrameError(f"align: party {hop.source} answered the check of hop {hop.index} of party "
                                  f"{hop.origin}'s list with digests of other lists than this party multiplied (its "
                                  f"own, or party {hop.receiver}'s passed on: this party cannot tell which)")
    if not ristretto.is_valid_point(part[2 * dleq.DIGEST_BYTES:]):
        raise AlignmentFrameError(f"align: party {hop.source} answered a hop check with an invalid point", hop.source)
    if hop.source == hop.receiver and part[2 * dleq.DIGEST_BYTES:] != dleq.combine(  # K = 2: it would keep the proof
            ring.context(hop), digests[:32], digests[32:], inp, ring.threads):
        raise AlignmentFrameError(f"align: party {hop.source} answered the check of hop {hop.index} with another "
                                  "weighted sum than its list's (a proof on a point of its choice: refused)",
                                  hop.source)
    return dleq.prove(ring.scalar, ring.context(hop), part[2 * dleq.DIGEST_BYTES:])


def _verify(ring: Ring, hop: Hop, part: bytes, proof: bytes) -> None:
    out = ring.got[(hop.origin, hop.index)]
    inp_digest, out_digest, m = part[:32], part[32:64], part[64:]
    z = dleq.combine(ring.context(hop), inp_digest, dleq.digest(out), out, ring.threads)
    if out_digest != dleq.digest(out) or not dleq.verify(ring.publics[hop.prover], ring.context(hop), m, z, proof):
        raise AlignmentFrameError(f"align: the list of party {hop.origin} that party {hop.prover} multiplied (hop "
                                  f"{hop.index}) fails its proof: party {hop.prover} did not multiply every point "
                                  f"by its announced scalar, in order, or party {hop.source}, which sent it the list, "
                                  "answered the check falsely (this party cannot tell which)")
