"""The `plain` protocol across processes: contributions travel in clear (inside the links' TLS).

The active party receives every party's contribution separately and sums them itself, so it sees each
one: the baseline the secure protocols are measured against, and the leak the audits catch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .distributed import Peers
from .rounds import Round
from .views import View


class PlainBackend:
    protection = "clear"

    def __init__(self, peers: Peers, view: View | None = None) -> None:
        self.peers, self.view = peers, view

    @property
    def is_active(self) -> bool:
        return self.peers.is_active

    def _record(self, round: Round, kind: str, peer: int, value, protection: str | None = None) -> None:
        if self.view is not None:
            self.view.add(round.name, kind, peer, protection or self.protection, value)

    def _passive(self) -> list[int]:
        return [k for k in range(self.peers.n_parties) if k != self.peers.active_index]

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._record(round, "sent", self.peers.rank, value)
        if not self.is_active:
            self.peers.send_tensor(self.peers.active_index, round.name, value)
            return None
        gathered = {self.peers.rank: value}
        for sender in self._passive():
            gathered[sender] = self.peers.recv_tensor(sender, round.name, tuple(value.shape))
            self._record(round, "received", sender, gathered[sender])
        total = gathered[0].clone()
        for sender in range(1, self.peers.n_parties):  # in party order, exactly as the local runtime sums
            total = total + gathered[sender]
        return total

    def broadcast(self, round: Round, value: Tensor | None, shape: tuple[int, ...]) -> Tensor:
        if self.is_active:
            buffer = value.detach().to("cpu", torch.float32).contiguous()
            payload = buffer.numpy().tobytes()
            for party in self._passive():
                self.peers.send(party, round.name, payload)
            return buffer
        buffer = self.peers.recv_tensor(self.peers.active_index, round.name, shape)
        self._record(round, "received", self.peers.active_index, buffer, "clear")
        return buffer

    def close(self, clean: bool = True) -> None:
        pass
