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
