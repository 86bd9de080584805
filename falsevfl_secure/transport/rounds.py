"""The named rounds of the protocol and the checks every message must pass.

Stage 1 (pretraining) executes `posterior`, `latent`, `likelihood` and then their adjoints in
reverse: `likelihood_grad`, `latent_grad`, `posterior_grad`. Stage 2 and inference execute the
three forward rounds only, so no gradient that depends on labels ever reaches a passive party.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ProtocolError

FORWARD_ROUNDS = ("posterior", "latent", "likelihood")
ADJOINT = {"posterior": "posterior_grad", "latent": "latent_grad", "likelihood": "likelihood_grad"}
STAGE1_ROUNDS = (*FORWARD_ROUNDS, "likelihood_grad", "latent_grad", "posterior_grad")
ALL_ROUNDS = STAGE1_ROUNDS

# Which round may follow which: a forward pass is posterior -> latent -> likelihood; after it comes
# either the next forward pass (stage 2, inference) or the adjoints in reverse order (stage 1).
NEXT_ROUNDS = {
    None: ("posterior",),
    "posterior": ("latent",),
    "latent": ("likelihood",),
    "likelihood": ("posterior", "likelihood_grad"),
    "likelihood_grad": ("latent_grad",),
    "latent_grad": ("posterior_grad",),
    "posterior_grad": ("posterior",),
}


class RoundSequencer:
    """Refuses a round that is out of order (for example a `latent` before any `posterior`)."""

    def __init__(self) -> None:
        self.last: str | None = None

    def advance(self, name: str) -> None:
        if name not in NEXT_ROUNDS:
            raise ProtocolError(f"round {name!r}: field 'round': unknown round; rounds are {ALL_ROUNDS}")
        allowed = NEXT_ROUNDS[self.last]
        if name not in allowed:
            raise ProtocolError(f"round {name!r}: field 'round': out of order after {self.last!r} "
                                f"(expected {' or '.join(allowed)})")
        self.last = name

    def reset(self) -> None:
        self.last = None


def check_contributions(name: str, parties: Sequence[int], values: Sequence[Tensor], n_parties: int) -> None:
    """Refuse contributions that do not fit the round: unknown senders, mismatched shapes or
    dtypes, non-finite values. The error names the round and the field."""
    if not values:
        raise ProtocolError(f"round {name!r}: no contribution to aggregate")
    for party in parties:
        if not 0 <= party < n_parties:
            raise ProtocolError(f"round {name!r}: field 'sender': {party} is not a party (0..{n_parties - 1})")
    shape, dtype = values[0].shape, values[0].dtype
    for party, value in zip(parties, values, strict=True):
        if value.shape != shape:
            raise ProtocolError(
                f"round {name!r}: field 'shape': party {party} sent {tuple(value.shape)}, expected {tuple(shape)}"
            )
        if value.dtype != dtype:
            raise ProtocolError(f"round {name!r}: field 'dtype': party {party} sent {value.dtype}, expected {dtype}")
        if not bool(torch.isfinite(value).all()):
            raise ProtocolError(f"round {name!r}: field 'payload': party {party} sent non-finite values")


# Per round: the primitive, who sends, and the symbolic payload shape (B batch rows, S importance
# samples, H = d_h latent width). Matches protocols/*.toml.
ROUND_TABLE = {
    "posterior": ("aggregate", "party", ("B", "2H")),
    "latent": ("broadcast", "active", ("S", "B", "H")),
    "likelihood": ("aggregate", "party", ("S", "B")),
    "likelihood_grad": ("broadcast", "active", ("S", "B")),
    "latent_grad": ("aggregate", "party", ("S", "B", "H")),
    "posterior_grad": ("broadcast", "active", ("B", "2H")),
}
PROTECTIONS = ("clear", "secret-shared", "ckks")


@dataclass(frozen=True)
class Message:
    """One cross-party message as the protocol sees it (the payload itself travels separately).

    `sender` and `receivers` are party indices; the active party's index for the active role.
    """

    round: str
    sender: int
    receivers: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    protection: str


class MessageValidator:
    """Checks every message against its round: known round, in order, the right sender and
    receivers, the declared shape (consistent B, S, d_h within a pass), float32, a protection the
    protocol allows. Refusals name the round and the field."""

    def __init__(self, n_parties: int, active_party: int, protection: str) -> None:
        self.n_parties, self.active_party, self.protection = n_parties, active_party, protection
        self.sequencer = RoundSequencer()
        self.sizes: dict[str, int] = {}

    def check(self, message: Message) -> None:
        name = message.round
        if name not in ROUND_TABLE:
            raise ProtocolError(f"round {name!r}: field 'round': unknown round; rounds are {ALL_ROUNDS}")
        primitive, sender_role, symbols = ROUND_TABLE[name]
        if not isinstance(message.sender, int) or not 0 <= message.sender < self.n_parties:
            raise ProtocolError(f"round {name!r}: field 'sender': {message.sender!r} is not a party "
                                f"(0..{self.n_parties - 1})")
        if sender_role == "active" and message.sender != self.active_party:
            raise ProtocolError(f"round {name!r}: field 'sender': only the active party "
                                f"({self.active_party}) sends this round, not {message.sender}")
        expected_receivers = ((self.active_party,) if primitive == "aggregate"
                              else tuple(k for k in range(self.n_parties) if k != self.active_party))
        if tuple(message.receivers) != expected_receivers:
            raise ProtocolError(f"round {name!r}: field 'receivers': {tuple(message.receivers)} "
                                f"!= {expected_receivers}")
        if message.dtype != "float32":
            raise ProtocolError(f"round {name!r}: field 'dtype': {message.dtype} is not float32")
        allowed = "clear" if primitive == "broadcast" else self.protection
        if message.protection != allowed:
            raise ProtocolError(f"round {name!r}: field 'protection': {message.protection!r}, "
                                f"the protocol requires {allowed!r}")
        self._check_shape(name, symbols, tuple(message.shape))
        self.sequencer.advance(name)

    def _check_shape(self, name: str, symbols: tuple[str, ...], shape: tuple[int, ...]) -> None:
        if name == "posterior":  # a new pass: B and d_h are set by its first round
            self.sizes = {}
        if len(shape) != len(symbols) or any((not isinstance(d, int)) or d < 1 for d in shape):
            raise ProtocolError(f"round {name!r}: field 'shape': {shape} does not match ({', '.join(symbols)})")
        for symbol, size in zip(symbols, shape, strict=True):
            key, factor = (symbol[1:], 2) if symbol.startswith("2") else (symbol, 1)
            if size % factor:
                raise ProtocolError(f"round {name!r}: field 'shape': {shape} does not match ({', '.join(symbols)})")
            value = size // factor
            if self.sizes.setdefault(key, value) != value:
                raise ProtocolError(f"round {name!r}: field 'shape': {key} = {value} here but "
                                    f"{self.sizes[key]} earlier in this pass")

    def reset(self) -> None:
        self.sequencer.reset()
        self.sizes = {}
