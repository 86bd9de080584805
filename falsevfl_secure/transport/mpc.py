"""The `mpc` protocol: sums are computed on CrypTen arithmetic secret shares among the K party
processes and revealed to the active party only (`secure.mpc_sum.secure_sum`). Broadcasts from
the active party (latent samples and the gradients of the sums) are the same for every party and
travel in clear, as in `plain`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..crypten_shim import import_crypten
from ..secure.mpc_sum import ZeroShareStream, secure_sum
from .plain import PlainBackend


class MpcBackend(PlainBackend):
    protocol = "mpc"
    protection = "secret-shared"

    def __init__(self, party: int, n_parties: int, active_party: int, group=None, view: list | None = None) -> None:
        super().__init__(party, n_parties, active_party, group=group, view=view)
        self.shares = ZeroShareStream(import_crypten())  # zero shares drawn while this party waits

    def sum_to_active(self, name: str, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        received: list | None = [] if self.view is not None or self.party == self.active_party else None
        total = secure_sum(value, dst=self.active_party, view=received, shares=self.shares)
        message_bytes = (value.numel() + 1) * 8  # int64 ring elements plus the error flag
        if self.party != self.active_party:
            self.bytes_counter.sent += message_bytes
            return None
        self.bytes_counter.received += message_bytes * (self.n_parties - 1)
        if self.view is not None:
            for share in received:
                self.view.append({"round": name, "from": share.src, "protection": "secret-shared",
                                  "value": share.raw})
            self.view.append({"round": name, "from": -1, "protection": "revealed-sum", "value": total.float()})
        return total.to(torch.float32)

    def close(self) -> None:
        self.shares.close()
