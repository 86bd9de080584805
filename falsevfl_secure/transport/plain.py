"""The `plain` protocol across processes: contributions travel in clear.

The active party receives every party's contribution separately (a gather) and sums them itself, so it
sees each one: the baseline the secure protocols are measured against, and the leak the audits catch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .base import nbytes
from .distributed import ByteCounter
from .rounds import Round
from .views import View


class PlainBackend:
    protection = "clear"

    def __init__(self, party: int, n_parties: int, active_index: int, group=None, view: View | None = None) -> None:
        self.party, self.n_parties, self.active_index = party, n_parties, active_index
        self.group = group  # the parties' process group; its ranks are the parties' indices
        self.view = view
        self.counter = ByteCounter()

    @property
    def is_active(self) -> bool:
        return self.party == self.active_index

    def _record(self, round: Round, kind: str, peer: int, value, protection: str | None = None) -> None:
        if self.view is not None:
            self.view.add(round.name, kind, peer, protection or self.protection, value)

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._record(round, "sent", self.party, value)
        if not self.is_active:
            dist.gather(value, None, dst=self.active_index, group=self.group)
            self.counter.sent += nbytes(value)
            return None
        gathered = [torch.empty_like(value) for _ in range(self.n_parties)]
        dist.gather(value, gathered, dst=self.active_index, group=self.group)
        self.counter.received += nbytes(value) * (self.n_parties - 1)
        for sender, contribution in enumerate(gathered):
            if sender != self.party:
                self._record(round, "received", sender, contribution)
        total = gathered[0].clone()
        for contribution in gathered[1:]:  # in party order, exactly as the local runtime sums
            total = total + contribution
        return total

    def broadcast(self, round: Round, value: Tensor | None, shape: tuple[int, ...]) -> Tensor:
        if self.is_active:
            buffer = value.detach().to("cpu", torch.float32).contiguous()
            dist.broadcast(buffer, src=self.active_index, group=self.group)
            self.counter.sent += nbytes(buffer) * (self.n_parties - 1)
            return buffer
        buffer = torch.empty(shape, dtype=torch.float32)
        dist.broadcast(buffer, src=self.active_index, group=self.group)
        self.counter.received += nbytes(buffer)
        self._record(round, "received", self.active_index, buffer, "clear")
        return buffer

    def close(self) -> None:
        pass
