"""The alignment's star ring (secure/align.py): where each blinded list goes, who multiplies it, who proves
each multiplication and who checks each proof.

The passive parties, in rank order, form a ring of m = K - 1; the active party is its hub. A passive party's own
list goes once around the passive ring (hops 1..m-1, each by the next passive party), then to the active party,
which applies the last scalar (hop m) and returns it to the list's origin. The active party's list (blinded by
a throwaway scalar of its own) goes through every passive party (hops 1..m) and back to it.

Every hop is proved (secure/dleq.py): its prover attaches a batched Chaum-Pedersen proof to the list it sends on;
after the lists, one check round: the party that received a hop's output (V) sends the digest of it to the party
that sent the hop's input (Q), which answers with the digest of its input and M, its weighted sum; V computes Z
and verifies the proof against the prover's announced public key. Neither sees the other's list. Where V and Q
are one party (two parties in all), it checks alone.
"""

from __future__ import annotations

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
    """One party's part of the ring: its scalar, every party's public key, the lists it sent (as some hop's source)
    and those it received with their proofs (as some hop's receiver)."""

    wire: Wire
    rank: int
    counts: np.ndarray
    publics: list[bytes]
    session: bytes
    scalar: bytes
    threads: int = 1
    sent: dict[tuple[int, int], bytes] = field(default_factory=dict)
    got: dict[tuple[int, int], tuple[bytes, bytes]] = field(default_factory=dict)

    def context(self, hop: Hop) -> bytes:
        return self.session + _HOP.pack(hop.origin, hop.index, hop.prover)

    def multiply(self, origin: int, index: int, points: bytes) -> tuple[bytes, bytes]:
        """This party's hop `index` of `origin`'s list: the product and its proof."""
        out = ristretto.scalar_mult_batch(self.scalar, points, threads=self.threads)
        if not points:  # an empty list: nothing to prove (its hops are not checked)
            return out, bytes(dleq.PROOF_BYTES)
        hop = Hop(origin, index, self.rank, -1, -1)
        m = dleq.combine(self.context(hop), dleq.digest(points), dleq.digest(out), points, self.threads)
        return out, dleq.prove(self.scalar, self.context(hop), m)

    def send_list(self, dst: int, origin: int, index: int, points: bytes, proof: bytes = b"") -> None:
        """`origin`'s list after hop `index` (with its proof from hop 1 on); kept as the next hop's input."""
        self.sent[(origin, index + 1)] = points
        self.wire.send(dst, points + proof)

    def recv_list(self, step: str, src: int, origin: int, index: int) -> bytes:
        """`origin`'s list after hop `index`, whole valid points of origin's count (and the proof, kept)."""
        frame = self.wire.recv(step, src)
        size = _P * int(self.counts[origin])
        expect_length(frame, size + (dleq.PROOF_BYTES if index else 0), step, src, counted=True)
        bad = ristretto.first_invalid_point(frame[:size], threads=self.threads)
        if bad >= 0:
            raise AlignmentFrameError(f"align: {step} frame from party {src}: point {bad} is not a valid "
                                      "ristretto255 point (non-canonical encoding or the identity)", src)
        if index:
            self.got[(origin, index)] = frame[:size], frame[size:]
        return frame[:size]


def check_hops(ring: Ring, schedule: list[Hop]) -> None:
    """The check round: every hop this party received is verified with the help of the party that sent its input;
    raises AlignmentFrameError naming the prover of a hop whose proof fails (an empty list has nothing to check)."""
    me, schedule = ring.rank, [h for h in schedule if ring.counts[h.origin] > 0]
    asks = _grouped([h for h in schedule if h.receiver == me and h.source != me], "source")
    answers = _grouped([h for h in schedule if h.source == me and h.receiver != me], "receiver")
    for source, group in asks.items():  # sends never block: every ask goes out before any wait
        ring.wire.send(source, b"".join(dleq.digest(ring.got[(h.origin, h.index)][0]) for h in group))
    for receiver, group in answers.items():
        frame = ring.wire.recv("hop-ask", receiver)
        expect_length(frame, dleq.DIGEST_BYTES * len(group), "hop-ask", receiver)
        ring.wire.send(receiver, b"".join(_answer(ring, h, frame[32 * i:32 * i + 32]) for i, h in enumerate(group)))
    for source, group in asks.items():
        frame = ring.wire.recv("hop-answer", source)
        expect_length(frame, 64 * len(group), "hop-answer", source)
        for i, h in enumerate(group):
            _verify(ring, h, frame[64 * i:64 * i + 32], frame[64 * i + 32:64 * i + 64])
    for h in (h for h in schedule if h.receiver == me == h.source):
        inp = ring.sent[(h.origin, h.index)]
        _verify(ring, h, dleq.digest(inp), _answer(ring, h, dleq.digest(ring.got[(h.origin, h.index)][0]))[32:])


def _grouped(selected: list[Hop], by: str) -> dict[int, list[Hop]]:
    groups: dict[int, list[Hop]] = {}
    for h in selected:
        groups.setdefault(getattr(h, by), []).append(h)
    return dict(sorted(groups.items()))


def _answer(ring: Ring, hop: Hop, out_digest: bytes) -> bytes:
    """The digest of the hop's input this party sent, and M, its weighted sum under the receiver's digest."""
    inp = ring.sent[(hop.origin, hop.index)]
    return dleq.digest(inp) + dleq.combine(ring.context(hop), dleq.digest(inp), out_digest, inp, ring.threads)


def _verify(ring: Ring, hop: Hop, inp_digest: bytes, m: bytes) -> None:
    out, proof = ring.got[(hop.origin, hop.index)]
    z = dleq.combine(ring.context(hop), inp_digest, dleq.digest(out), out, ring.threads)
    if not dleq.verify(ring.publics[hop.prover], ring.context(hop), m, z, proof):
        raise AlignmentFrameError(f"align: the list of party {hop.origin} that party {hop.prover} multiplied (hop "
                                  f"{hop.index}) fails its proof: party {hop.prover} did not multiply every point "
                                  f"by its announced scalar, in order (or party {hop.source}, which sent it the list, "
                                  "answered the check falsely)", hop.prover)
