"""The named rounds of the protocol and the checks every message must pass.

Stage 1 (pretraining) executes `posterior`, `latent`, `likelihood` and then their adjoints in
reverse: `likelihood_grad`, `latent_grad`, `posterior_grad`. Stage 2 and inference execute the
three forward rounds only, so no gradient that depends on labels ever reaches a passive party.
"""

from __future__ import annotations

from collections.abc import Sequence

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
