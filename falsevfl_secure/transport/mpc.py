"""The `mpc` protocol: every sum is a pairwise-masked secret-shared sum revealed to the active party
only (`secure.mpc_sum`); broadcasts travel in clear (inside the links' TLS), as in `plain`.

The pair keys come from the session's signed X25519 exchange (`transport.handshake`); nothing secret
comes from CrypTen's generators or from any seed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..secure.errors import SecureRangeError
from ..secure.fixed_point import max_safe_abs
from ..secure.masks import ZeroShares
from ..secure.mpc_sum import secure_sum
from .distributed import Peers
from .plain import PlainBackend
from .rounds import Round
from .views import View


class MpcBackend(PlainBackend):
    protection = "secret-shared"

    def __init__(self, peers: Peers, pair_keys: dict[int, bytes], view: View | None = None) -> None:
        super().__init__(peers, view)
        self.shares = ZeroShares(peers.rank, pair_keys)

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._record(round, "sent", self.peers.rank, value)
        received: list | None = [] if self.view is not None else None
        try:
            total = secure_sum(value, self.peers.active_index, self.shares, self.peers, tag=round.name,
                               view=received)
        except SecureRangeError as error:
            raise SecureRangeError(f"round {round.name!r}: {error}; mpc carries |x| < "
                                   f"{max_safe_abs(self.peers.n_parties):.3g} per party at K = "
                                   f"{self.peers.n_parties} (check the features are standardised and finite)") from None
        if not self.is_active:
            return None
        for share in received or []:
            self._record(round, "received", share.src, share.raw)
        self._record(round, "revealed", -1, total)
        return total.to(torch.float32)

    def wire_bytes(self, round: Round, numel: int) -> int:
        """A sum's share is numel + 1 int64 ring elements (the values and the range flag)."""
        return 8 * (numel + 1) if round.is_aggregate else 4 * numel

    def rekey(self, pair_keys: dict[int, bytes]) -> None:
        """Masks among the parties still in the run, from fresh pair keys (a party left)."""
        self.shares.close()
        self.shares = ZeroShares(self.peers.rank, {k: key for k, key in pair_keys.items() if k in self.peers.alive})

    def close(self, clean: bool = True) -> None:
        self.shares.close()
