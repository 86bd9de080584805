"""The `plain` protocol over torch.distributed: contributions travel in clear.

The active party receives every party's contribution separately (a gather) and sums them itself,
so it sees each one: this is the baseline the secure protocols are measured against, and the leak
that the audits must catch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class ByteCounter:
    sent: int = 0
    received: int = 0


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class PlainBackend:
    protocol = "plain"
    protection = "clear"

    def __init__(self, party: int, n_parties: int, active_party: int, group=None,
                 view: list | None = None) -> None:
        self.party, self.n_parties, self.active_party = party, n_parties, active_party
        self.group = group
        self.view = view  # what this party received, for audits (None: not recorded)
        self.bytes_counter = ByteCounter()

    def _record(self, name: str, sender: int, value: Tensor) -> None:
        if self.view is not None:
            self.view.append({"round": name, "from": sender, "protection": "clear", "value": value.clone()})

    def sum_to_active(self, name: str, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        if self.party != self.active_party:
            dist.gather(value, None, dst=self.active_party, group=self.group)
            self.bytes_counter.sent += nbytes(value)
            return None
        gathered = [torch.empty_like(value) for _ in range(self.n_parties)]
        dist.gather(value, gathered, dst=self.active_party, group=self.group)
        self.bytes_counter.received += nbytes(value) * (self.n_parties - 1)
        for sender, contribution in enumerate(gathered):
            if sender != self.party:
                self._record(name, sender, contribution)
        # Sum in party order, exactly as the local runtime does, so both give identical floats.
        total = gathered[0].clone()
        for contribution in gathered[1:]:
            total = total + contribution
        return total

    def broadcast(self, name: str, value: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        if self.party == self.active_party:
            buffer = value.detach().to("cpu", dtype).contiguous()
            dist.broadcast(buffer, src=self.active_party, group=self.group)
            self.bytes_counter.sent += nbytes(buffer) * (self.n_parties - 1)
            return buffer
        buffer = torch.empty(shape, dtype=dtype)
        dist.broadcast(buffer, src=self.active_party, group=self.group)
        self.bytes_counter.received += nbytes(buffer)
        self._record(name, self.active_party, buffer)
        return buffer
