"""The rounds of every method, defined once: the vocabulary every table, check, spec and audit derives from.

Every cross-party protocol here is two primitives. `aggregate` sends every party's contribution to the
active party as one sum; `broadcast` sends the active party's value to every other party. Rounds come in
aggregate/broadcast pairs, each the other's adjoint: the backward of a sum broadcasts its gradient back
and the backward of a broadcast sums the parties' gradients (as in `torch.distributed.nn.functional`).
`VOCABULARY` lists every round of every method; a round's position in it is its id on the wire. A method
(`falsevfl_secure.methods`) states which rounds it runs in each stage as a `RoundTable`; the validator,
the transports, the he aggregator and the audit work from the method's table.

FALSE-VFL's stage 1 runs three forward rounds and then their adjoints in reverse; its stage 2 and
inference run the forward rounds only, so no gradient that depends on labels ever reaches a passive party.
The baselines fuse the parties' embeddings with one sum (`embedding`, or `subsets` for LASER-VFL's
sampled subsets) whose adjoint carries the label loss's gradient back to every party; FedHSSL adds the
cross-party SimSiam target (`cross_view` then `cross_target`) and its partial model averaging
(`model_sum` then `model_mean`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

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
    H the latent width d_h, "2H" twice that, "2H+16" sixteen more, E an embedding width, T sampled
    subsets, P a parameter count, a number a fixed size), the axis that indexes batch rows (None: the
    payload is one row, e.g. model parameters), and the round that is its adjoint. A broadcast of
    reparameterised samples with `moments_adjoint` has an adjoint that carries the gradient's two sample
    moments (`transport.moments`), not the gradient."""

    name: str
    primitive: Primitive
    payload: tuple[str, ...]
    batch_axis: int | None
    adjoint_name: str
    moments_adjoint: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_aggregate", self.primitive is Primitive.AGGREGATE)  # asked on every message

    @property
    def adjoint(self) -> Round:
        return by_name(self.adjoint_name)

    @cached_property
    def index(self) -> int:
        """The round's id on the wire: its position in `VOCABULARY`."""
        return VOCABULARY.index(self)

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
EMBEDDING = Round("embedding", AGGREGATE, ("B", "E"), 0, "embedding_grad")  # the fusion of embeddings
EMBEDDING_GRAD = Round("embedding_grad", BROADCAST, ("B", "E"), 0, "embedding")
SUBSETS = Round("subsets", AGGREGATE, ("T", "B", "E"), 1, "subsets_grad")  # one fusion per sampled subset
SUBSETS_GRAD = Round("subsets_grad", BROADCAST, ("T", "B", "E"), 1, "subsets")
CROSS_VIEW = Round("cross_view", AGGREGATE, ("B", "E"), 0, "cross_target")  # FedHSSL: the parties' projections
CROSS_TARGET = Round("cross_target", BROADCAST, ("B", "E"), 0, "cross_view")  # ... their sum, back to all
MODEL_SUM = Round("model_sum", AGGREGATE, ("P",), None, "model_mean")  # FedHSSL: partial model averaging
MODEL_MEAN = Round("model_mean", BROADCAST, ("P",), None, "model_sum")
# FALSE-VFL with `latent_broadcast = "moments"` (measured, not the default: README): the posterior's mean and
# scale and 16 words of a per-row sampling key instead of S samples; its adjoint sums their gradients.
LATENT_MOMENTS = Round("latent_moments", BROADCAST, ("B", "2H+16"), 0, "latent_moments_grad")
LATENT_MOMENTS_GRAD = Round("latent_moments_grad", AGGREGATE, ("B", "2H+16"), 0, "latent_moments")

VOCABULARY: tuple[Round, ...] = (POSTERIOR, LATENT, LIKELIHOOD, LIKELIHOOD_GRAD, LATENT_GRAD, POSTERIOR_GRAD,
                                 EMBEDDING, EMBEDDING_GRAD, SUBSETS, SUBSETS_GRAD, CROSS_VIEW, CROSS_TARGET,
                                 MODEL_SUM, MODEL_MEAN, LATENT_MOMENTS, LATENT_MOMENTS_GRAD)
AGGREGATES: tuple[Round, ...] = tuple(r for r in VOCABULARY if r.is_aggregate)
_BY_NAME = {r.name: r for r in VOCABULARY}

# Every other message a role may receive: the set-up and control steps (protocols/session.toml specifies
# each one's sender, receivers and payload). Anything else a role receives is a leak the audit reports.
CONTROL_STEPS: tuple[str, ...] = ("hello", "roster", "keys", "context", "align", "kept", "kept-ack", "resume",
                                  "resume-ack", "barrier", "stop", "bounds", "bounds-ack", "lost", "lost-ack", "rejoin",
                                  "epoch", "epoch-ack", "pass-done", "model", "budget")


def by_name(name: str) -> Round:
    if name not in _BY_NAME:
        raise ProtocolError(f"round {name!r}: field 'round': unknown round; rounds are {tuple(_BY_NAME)}")
    return _BY_NAME[name]


Pass = tuple[Round, ...]


@dataclass(frozen=True)
class RoundTable:
    """A method's rounds: per stage, the rounds of one step in order (`steps`) and the rounds at the end
    of every epoch (`epoch_end`, e.g. a model average). A pass is one such sequence; a pass may follow any
    pass. Stages without rounds train locally (nothing crosses a party boundary)."""

    steps: Mapping[Stage, Pass]
    epoch_end: Mapping[Stage, Pass] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rounds in [*self.steps.values(), *self.epoch_end.values()]:
            unknown = [r.name for r in rounds if _BY_NAME.get(r.name) is not r]
            if unknown:
                raise ValueError(f"rounds {unknown} are not in the vocabulary")

    # The table's properties are computed once per table (once per run), not on every message.
    @cached_property
    def passes(self) -> tuple[Pass, ...]:
        return tuple(p for p in (*self.steps.values(), *self.epoch_end.values()) if p)

    @cached_property
    def rounds(self) -> tuple[Round, ...]:
        """Every round the method runs, in vocabulary order."""
        used = {r for p in self.passes for r in p}
        return tuple(r for r in VOCABULARY if r in used)

    @cached_property
    def names(self) -> dict[str, Round]:
        return {r.name: r for r in self.rounds}

    @cached_property
    def firsts(self) -> frozenset[Round]:
        """The rounds that open a pass."""
        return frozenset(p[0] for p in self.passes)

    def step(self, stage: Stage) -> Pass:
        """The rounds of one step of `stage`, in order."""
        return tuple(self.steps.get(stage, ()))

    def successors(self) -> dict[str | None, tuple[str, ...]]:
        """Which round may follow which: a pass's rounds in order, and after a pass any pass."""
        follows: dict[str | None, set[str]] = {None: {r.name for r in self.firsts}}
        for rounds in self.passes:
            names = [r.name for r in rounds]
            for before, after in zip(names, names[1:], strict=False):
                follows.setdefault(before, set()).add(after)
            follows.setdefault(names[-1], set()).update(r.name for r in self.firsts)
        order = {r.name: i for i, r in enumerate(VOCABULARY)}
        return {k: tuple(sorted(v, key=order.__getitem__)) for k, v in follows.items()}

    def of(self, name: str) -> Round:
        """The round `name` of this table; any other name is refused."""
        round = self.names.get(name) or by_name(name)
        if round.name not in self.names:
            raise ProtocolError(f"round {name!r}: field 'round': not a round of this method; its rounds are "
                                f"{tuple(r.name for r in self.rounds)}")
        return round


def largest(round: Round, sizes: Mapping[str, int]) -> int:
    """The most values a frame of `round` holds when each size name is at most `sizes[name]`."""
    count = 1
    for symbol in round.payload:
        key, factor, offset = _symbol(symbol)
        count *= offset + (factor * int(sizes[key]) if key is not None else 0)
    return count


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
    """Checks every message against its round in the method's table: a round of the method, in order, the
    right sender and receivers, the declared shape (consistent B, S, d_h, ... within a pass), float32, the
    protection the protocol gives the round. Refusals name the round and the field. What each round
    expects is worked out once per table (`use`), so a message costs one lookup and its comparisons."""

    def __init__(self, n_parties: int, active_index: int, protection: str, table: RoundTable | None = None) -> None:
        self.n_parties, self.active_index, self.protection = n_parties, active_index, protection
        self.table: RoundTable | None = None
        self.use(table)

    def use(self, table: RoundTable | None) -> None:
        """Check against `table` (a method's rounds) from now on, starting afresh."""
        self.table = table
        self.next = table.successors() if table is not None else {}
        self.firsts = table.firsts if table is not None else frozenset()
        self.expect = {r.name: (r, r.receivers(self.n_parties, self.active_index),
                                self.protection if r.is_aggregate else "clear", tuple(map(_symbol, r.payload)))
                       for r in (table.rounds if table is not None else ())}
        self.reset()

    def check(self, message: Message) -> None:
        if self.table is None:
            raise ProtocolError(f"round {message.round!r}: no method's round table to check it against")
        if message.round not in self.expect:
            self.table.of(message.round)  # raises: unknown, or not a round of this method
        round, receivers, protection, _ = self.expect[message.round]
        sender = message.sender
        if not isinstance(sender, int) or not 0 <= sender < self.n_parties:
            _fail(round, "sender", f"{sender!r} is not a party (0..{self.n_parties - 1})")
        if not round.is_aggregate and sender != self.active_index:
            _fail(round, "sender", f"only the active party ({self.active_index}) sends this round, not {sender}")
        if tuple(message.receivers) != receivers:
            _fail(round, "receivers", f"{tuple(message.receivers)} != {receivers}")
        if message.dtype != "float32":
            _fail(round, "dtype", f"{message.dtype} is not float32")
        if message.protection != protection:
            _fail(round, "protection", f"{message.protection!r}, the protocol requires {protection!r}")
        self.check_own(round, tuple(message.shape))

    def check_own(self, round: Round, shape: tuple[int, ...]) -> None:
        """A round this process runs itself (its sender, receivers, dtype and protection follow from the
        primitive and the backend): its shape (consistent sizes within a pass) and its place in the table."""
        if self.table is None or round.name not in self.expect:
            self.check(Message(round.name, -1, (), shape, "float32", ""))  # raises, naming what is wrong
        symbols = self.expect[round.name][3]
        if round in self.firsts:  # a new pass: B, S, H, ... are set by its first round
            self.sizes = {}
        mismatch = f"{shape} does not match ({', '.join(round.payload)})"
        if len(shape) != len(symbols) or any(not isinstance(d, int) or d < 1 for d in shape):
            _fail(round, "shape", mismatch)
        for (key, factor, offset), size in zip(symbols, shape, strict=True):
            if key is None:
                if size != offset:
                    _fail(round, "shape", mismatch)
                continue
            if size <= offset or (size - offset) % factor:
                _fail(round, "shape", mismatch)
            value = (size - offset) // factor
            if self.sizes.setdefault(key, value) != value:
                _fail(round, "shape", f"{key} = {value} here but {self.sizes[key]} earlier in this pass")
        allowed = self.next[self.last]
        if round.name not in allowed:
            _fail(round, "round", f"out of order after {self.last!r} (expected {' or '.join(allowed)})")
        self.last = round.name

    def reset(self) -> None:
        self.last, self.sizes = None, {}


def _symbol(symbol: str) -> tuple[str | None, int, int]:
    """(size name, factor, offset) of a payload symbol such as "B", "2H", "2H+16" or "16" (no name: a
    fixed size, the offset)."""
    head, _, tail = symbol.partition("+")
    if head.isdigit():
        return None, 1, int(head)
    factor = int(head[:-1]) if head[:-1] else 1
    return head[-1], factor, int(tail) if tail else 0


def _fail(round: Round, field: str, detail: str) -> None:
    raise ProtocolError(f"round {round.name!r}: field {field!r}: {detail}")
