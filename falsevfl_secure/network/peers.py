"""The roles of a run by rank, over one role's network: byte frames to and from a rank."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .network import Network


@dataclass
class Peers:
    """The roles of a run by rank (parties 0..K-1, then helpers such as the he aggregator) over one
    role's network. `n_parties` (also `size`) is the number of parties; `lost` the parties that left a run
    that goes on without them (`lose` adds to it, `restore` takes a party that rejoined out of it),
    `alive` the others in rank order (every sum is over them)."""

    network: Network
    names: tuple[str, ...]
    rank: int
    n_parties: int
    active_index: int
    alive: tuple[int, ...] = field(init=False)
    _lost: frozenset[int] = field(default=frozenset(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.alive = tuple(range(self.n_parties))  # read on every sum: kept, not recomputed

    @property
    def lost(self) -> frozenset[int]:
        return self._lost

    def lose(self, ranks: Iterable[int]) -> None:
        """These parties left the run: every later sum is over the others (the one way `lost` grows, so
        `alive` always follows it)."""
        self._lost = self._lost | frozenset(ranks)
        self.alive = tuple(k for k in range(self.n_parties) if k not in self._lost)

    def restore(self, ranks: Iterable[int]) -> None:
        """These parties rejoined the run (at an epoch's start): every later sum is over them again."""
        self._lost = self._lost - frozenset(ranks)
        self.alive = tuple(k for k in range(self.n_parties) if k not in self._lost)

    @property
    def size(self) -> int:
        return self.n_parties

    @property
    def is_active(self) -> bool:
        return self.rank == self.active_index

    def send(self, dst: int, tag: str, payload: bytes) -> None:
        self.network.send(self.names[dst], tag, payload)

    def recv(self, src: int, tag: str) -> bytes:
        return self.network.recv(self.names[src], tag)
