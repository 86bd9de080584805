"""The roles of a run by rank, over one role's network: byte frames to and from a rank."""

from __future__ import annotations

from dataclasses import dataclass, field

from .network import Network


@dataclass
class Peers:
    """The roles of a run by rank (parties 0..K-1, then helpers such as the he aggregator) over one
    role's network. `n_parties` (also `size`) is the number of parties; `lost` the parties that left a run
    that goes on without them."""

    network: Network
    names: tuple[str, ...]
    rank: int
    n_parties: int
    active_index: int
    lost: set[int] = field(default_factory=set)

    @property
    def size(self) -> int:
        return self.n_parties

    @property
    def alive(self) -> list[int]:
        """The parties still in the run, in rank order (every sum is over them)."""
        return [k for k in range(self.n_parties) if k not in self.lost]

    @property
    def is_active(self) -> bool:
        return self.rank == self.active_index

    def send(self, dst: int, tag: str, payload: bytes) -> None:
        self.network.send(self.names[dst], tag, payload)

    def recv(self, src: int, tag: str) -> bytes:
        return self.network.recv(self.names[src], tag)
