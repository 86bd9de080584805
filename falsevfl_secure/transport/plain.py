"""The `plain` protocol across processes: contributions travel in clear (inside the links' TLS).

The active party receives every party's contribution separately and sums them itself, so it sees each
one: the baseline the secure protocols are measured against, and the leak the audits catch. A non-finite
contribution is refused as under mpc and he: the party whose input it is refuses it (and sends NaNs in its
place, never its values, so nobody is left waiting), and the active party refuses any non-finite
contribution it receives, before it sums anything.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..secure.errors import SecureRangeError
from .distributed import Peers
from .rounds import Round, check_contributions
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
        return [k for k in self.peers.alive if k != self.peers.active_index]

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        finite = bool(torch.isfinite(value).all())
        if not self.is_active:
            sent = value if finite else torch.full_like(value, float("nan"))  # the refusal, without the values
            self._record(round, "sent", self.peers.rank, sent)
            self.peers.send_tensor(self.peers.active_index, round.name, sent)
            if not finite:
                me = self.peers.names[self.peers.rank]
                raise SecureRangeError(f"round {round.name!r}: {me} refused its own input: "
                                       f"{int((~torch.isfinite(value)).sum())} NaN/inf value(s)")
            return None
        self._record(round, "sent", self.peers.rank, value)
        gathered = {self.peers.rank: value}
        for sender in self._passive():
            gathered[sender] = self.peers.recv_tensor(sender, round.name, tuple(value.shape))
            self._record(round, "received", sender, gathered[sender])
        check_contributions(round, list(gathered), list(gathered.values()), self.peers.n_parties)
        ranks = sorted(gathered)
        total = gathered[ranks[0]].clone()
        for sender in ranks[1:]:  # in party order, exactly as the local runtime sums
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

    def wire_bytes(self, round: Round, numel: int) -> int:
        """The most bytes one frame of `round` with `numel` values takes under this protocol (float32)."""
        return 4 * numel

    def close(self, clean: bool = True) -> None:
        pass
