"""The protocol's rounds, defined once: the table every check, spec and audit derives from.

FALSE-VFL's cross-party protocol is two primitives. `aggregate` sends every party's contribution to the
active party as one sum; `broadcast` sends the active party's value to every other party. Each forward
round has an adjoint of the other primitive that carries its gradient back (as in
`torch.distributed.nn.functional`: the adjoint of a broadcast is a sum, and vice versa). Stage 1 runs the
three forward rounds and then their adjoints in reverse; stage 2 and inference run the forward rounds
only, so no gradient that depends on labels ever reaches a passive party.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch
from torch import Tensor

from ..config import Stage
from ..errors import ProtocolError


class Primitive(Enum):
    AGGREGATE = "aggregate"  # every party -> the active party, as one sum
    BROADCAST = "broadcast"  # the active party -> every other party, the same tensor


@dataclass(frozen=True)
class Round:
    """One round: its primitive, its payload's symbolic shape (B batch rows, S importance samples,
    H the latent width d_h, "2H" twice that, a digit a fixed size), the axis that indexes batch rows, and
    the round that is its adjoint. A broadcast of reparameterised samples with `moments_adjoint` has an
    adjoint that carries the gradient's two sample moments (`transport.moments`), not the gradient."""

    name: str
    primitive: Primitive
    payload: tuple[str, ...]
    batch_axis: int
    adjoint_name: str
    moments_adjoint: bool = False

    @property
    def adjoint(self) -> Round:
        return by_name(self.adjoint_name)

    @property
    def is_aggregate(self) -> bool:
        return self.primitive is Primitive.AGGREGATE

    def receivers(self, n_parties: int, active_index: int) -> tuple[int, ...]:
        """Who receives this round: the active party for a sum, every other party for a broadcast."""
        if self.is_aggregate:
            return (active_index,)
        return tuple(k for k in range(n_parties) if k != active_index)


AGGREGATE, BROADCAST = Primitive.AGGREGATE, Primitive.BROADCAST
POSTERIOR = Round("posterior", AGGREGATE, ("B", "2H"), 0, "posterior_grad")
LATENT = Round("latent", BROADCAST, ("S", "B", "H"), 1, "latent_grad", moments_adjoint=True)
LIKELIHOOD = Round("likelihood", AGGREGATE, ("S", "B"), 1, "likelihood_grad")
LIKELIHOOD_GRAD = Round("likelihood_grad", BROADCAST, ("S", "B"), 1, "likelihood")
LATENT_GRAD = Round("latent_grad", AGGREGATE, ("2", "B", "H"), 1, "latent")  # (sum_s g, sum_s g (h - hbar))
POSTERIOR_GRAD = Round("posterior_grad", BROADCAST, ("B", "2H"), 0, "posterior")

ROUNDS: tuple[Round, ...] = (POSTERIOR, LATENT, LIKELIHOOD, LIKELIHOOD_GRAD, LATENT_GRAD, POSTERIOR_GRAD)
FORWARD: tuple[Round, ...] = ROUNDS[:3]
AGGREGATES: tuple[Round, ...] = tuple(r for r in ROUNDS if r.is_aggregate)
STAGE_ROUNDS: dict[Stage, tuple[Round, ...]] = {Stage.PRETRAIN: ROUNDS, Stage.TRAIN: FORWARD, Stage.PREDICT: FORWARD}
_BY_NAME = {r.name: r for r in ROUNDS}

# Every other message a role may receive: the set-up and control steps (protocols/session.toml specifies
# each one's sender, receivers and payload). Anything else a role receives is a leak the audit reports.
CONTROL_STEPS: tuple[str, ...] = ("hello", "roster", "keys", "context", "align", "kept", "resume", "barrier", "stop")


def by_name(name: str) -> Round:
    if name not in _BY_NAME:
        raise ProtocolError(f"round {name!r}: field 'round': unknown round; rounds are {tuple(_BY_NAME)}")
    return _BY_NAME[name]


def _successors() -> dict[str | None, tuple[str, ...]]:
    """Which round may follow which: each stage's rounds in order, and after a pass the next pass."""
    follows: dict[str | None, set[str]] = {None: {ROUNDS[0].name}}
    for rounds in STAGE_ROUNDS.values():
        names = [r.name for r in rounds]
        for before, after in zip(names, [*names[1:], names[0]], strict=True):
            follows.setdefault(before, set()).add(after)
    return {k: tuple(sorted(v, key=lambda n: ROUNDS.index(_BY_NAME[n]))) for k, v in follows.items()}


NEXT_ROUNDS = _successors()


def check_contributions(round: Round, parties: Sequence[int], values: Sequence[Tensor], n_parties: int) -> None:
    """Refuse contributions that do not fit the round: unknown senders, mismatched shapes or dtypes,
    non-finite values. The error names the round and the field."""
    if not values:
        raise ProtocolError(f"round {round.name!r}: no contribution to aggregate")
    shape, dtype = values[0].shape, values[0].dtype
    for party, value in zip(parties, values, strict=True):
        if not 0 <= party < n_parties:
            raise ProtocolError(f"round {round.name!r}: field 'sender': {party} is not a party (0..{n_parties - 1})")
        if value.shape != shape:
            raise ProtocolError(f"round {round.name!r}: field 'shape': party {party} sent {tuple(value.shape)}, "
                                f"expected {tuple(shape)}")
        if value.dtype != dtype:
            raise ProtocolError(f"round {round.name!r}: field 'dtype': party {party} sent {value.dtype}, "
                                f"expected {dtype}")
        if not bool(torch.isfinite(value).all()):
            raise ProtocolError(f"round {round.name!r}: field 'payload': party {party} sent non-finite values")


@dataclass(frozen=True)
class Message:
    """One cross-party message as the protocol sees it (the payload travels separately).

    `sender` and `receivers` are party indices; `round` is the round's name as it is on the wire."""

    round: str
    sender: int
    receivers: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    protection: str


class MessageValidator:
    """Checks every message against its round: known round, in order, the right sender and receivers,
    the declared shape (consistent B, S, d_h within a pass), float32, the protection the protocol
    gives the round. Refusals name the round and the field."""

    def __init__(self, n_parties: int, active_index: int, protection: str) -> None:
        self.n_parties, self.active_index, self.protection = n_parties, active_index, protection
        self.last: str | None = None
        self.sizes: dict[str, int] = {}

    def check(self, message: Message) -> None:
        round = by_name(message.round)
        fail = _failure(round)
        if not isinstance(message.sender, int) or not 0 <= message.sender < self.n_parties:
            fail("sender", f"{message.sender!r} is not a party (0..{self.n_parties - 1})")
        if not round.is_aggregate and message.sender != self.active_index:
            fail("sender", f"only the active party ({self.active_index}) sends this round, not {message.sender}")
        expected = round.receivers(self.n_parties, self.active_index)
        if tuple(message.receivers) != expected:
            fail("receivers", f"{tuple(message.receivers)} != {expected}")
        if message.dtype != "float32":
            fail("dtype", f"{message.dtype} is not float32")
        allowed = self.protection if round.is_aggregate else "clear"
        if message.protection != allowed:
            fail("protection", f"{message.protection!r}, the protocol requires {allowed!r}")
        self._check_shape(round, tuple(message.shape))
        self._advance(round)

    def _advance(self, round: Round) -> None:
        allowed = NEXT_ROUNDS[self.last]
        if round.name not in allowed:
            _failure(round)("round", f"out of order after {self.last!r} (expected {' or '.join(allowed)})")
        self.last = round.name

    def _check_shape(self, round: Round, shape: tuple[int, ...]) -> None:
        if round is ROUNDS[0]:  # a new pass: B and d_h are set by its first round
            self.sizes = {}
        mismatch = f"{shape} does not match ({', '.join(round.payload)})"
        if len(shape) != len(round.payload) or any(not isinstance(d, int) or d < 1 for d in shape):
            _failure(round)("shape", mismatch)
        for symbol, size in zip(round.payload, shape, strict=True):
            if symbol.isdigit():
                if size != int(symbol):
                    _failure(round)("shape", mismatch)
                continue
            key, factor = (symbol[1:], 2) if symbol.startswith("2") else (symbol, 1)
            if size % factor:
                _failure(round)("shape", mismatch)
            if self.sizes.setdefault(key, size // factor) != size // factor:
                _failure(round)("shape", f"{key} = {size // factor} here but {self.sizes[key]} earlier in this pass")

    def reset(self) -> None:
        self.last, self.sizes = None, {}


def _failure(round: Round):
    def fail(field: str, detail: str) -> None:
        raise ProtocolError(f"round {round.name!r}: field {field!r}: {detail}")
    return fail
