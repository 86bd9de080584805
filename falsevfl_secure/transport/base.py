"""The contract every transport implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from torch import Tensor

from ..placement import Active
from .accounting import CommLog
from .rounds import Round, RoundTable


class Transport(Protocol):
    """How values cross party boundaries: the only way they do.

    `aggregate` delivers the sum of the hosted parties' contributions (and, across processes, every
    other party's) to the active party; `broadcast` delivers the active party's value to every hosted
    party. Both are differentiable: the gradient of a sum is broadcast back (the round's adjoint), the
    gradients of a broadcast are summed back. `backward` runs the adjoint rounds of the last forward
    pass in every process (only the active party has a loss), together with the process's own local
    losses (a party's self-supervised objective, which never leaves it). `use` binds the method's round
    table: every message is checked against it. `use_noise` puts each hosted party's differential-privacy
    stage (`ciphers.noise`) before its sums. `working` tells waiting peers the role's own work advances. `log`
    counts every round's traffic.
    """

    log: CommLog

    def use(self, table: RoundTable) -> None: ...

    def use_noise(self, stages: Mapping[int, object]) -> None: ...

    def aggregate(self, round: Round, contributions: Mapping[int, Tensor]) -> Active[Tensor]: ...

    def broadcast(self, round: Round, value: Active[Tensor], shape: tuple[int, ...]) -> dict[int, Tensor]: ...

    def backward(self, loss: Active[Tensor], local: Sequence[Tensor] = ()) -> None: ...

    def working(self) -> None:
        """One unit of this role's own work between passes is done (a cached epoch, a tree fit): peers
        waiting on it across processes see it progress."""

    def allow_work(self, units: int) -> None:
        """The most units of such work a peer may show in all while this role waits on it (from its own file)."""


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()
