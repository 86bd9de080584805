"""The `mpc` protocol: every sum is a pairwise-masked secret-shared sum revealed to the active party
only (`secure.mpc_sum`); broadcasts travel in clear, as in `plain`.

At start-up the parties agree one key per pair by X25519 (`secure.masks`), exchanging 32-byte public
keys; nothing secret comes from CrypTen's generators or from any seed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..secure.errors import SecureRangeError
from ..secure.fixed_point import max_safe_abs
from ..secure.masks import PUBLIC_KEY_BYTES, X25519Agreement, ZeroShares
from ..secure.mpc_sum import secure_sum
from .plain import PlainBackend
from .rounds import Round
from .views import View


def exchange_public_keys(public: bytes, n_parties: int, group=None) -> list[bytes]:
    """Every party's public key, in rank order (a fixed-schema all-gather of 32-byte tensors)."""
    mine = torch.frombuffer(bytearray(public), dtype=torch.uint8)
    keys = [torch.empty(PUBLIC_KEY_BYTES, dtype=torch.uint8) for _ in range(n_parties)]
    dist.all_gather(keys, mine, group=group)
    return [bytes(k.tolist()) for k in keys]


class MpcBackend(PlainBackend):
    protection = "secret-shared"

    def __init__(self, party: int, n_parties: int, active_index: int, group=None, view: View | None = None,
                 agreement=None) -> None:
        super().__init__(party, n_parties, active_index, group=group, view=view)
        agreement = agreement if agreement is not None else X25519Agreement()
        publics = exchange_public_keys(agreement.public_key(), n_parties, group)
        self.shares = ZeroShares(party, agreement.pair_keys(party, publics))

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._record(round, "sent", self.party, value)
        received: list | None = [] if self.view is not None else None
        try:
            total = secure_sum(value, self.active_index, self.shares, group=self.group, view=received)
        except SecureRangeError as error:
            raise SecureRangeError(f"round {round.name!r}: {error}; mpc carries |x| < "
                                   f"{max_safe_abs(self.n_parties):.3g} per party at K = {self.n_parties} "
                                   "(check the features are standardised and finite)") from error
        message_bytes = (value.numel() + 1) * 8  # int64 ring elements plus the error flag
        if not self.is_active:
            self.counter.sent += message_bytes
            return None
        self.counter.received += message_bytes * (self.n_parties - 1)
        for share in received or []:
            self._record(round, "received", share.src, share.raw)
        self._record(round, "revealed", -1, total)
        return total.to(torch.float32)

    def close(self) -> None:
        self.shares.close()
