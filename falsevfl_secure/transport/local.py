"""The in-process plain transport of the local runtime: all parties live in one process.

`aggregate` and `broadcast` are the only way values cross a party boundary. Both are autograd
functions whose backward is the adjoint collective (as in `torch.distributed.nn.functional`):

| primitive   | forward                              | backward (adjoint round)                 |
| ----------- | ------------------------------------ | ---------------------------------------- |
| aggregate   | parties -> active: sum of the inputs | active -> parties: the same gradient     |
| broadcast   | active -> parties: one copy each     | parties -> active: sum of the gradients  |
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor
from torch.autograd import Function

from ..errors import ProtocolError
from .accounting import CommLog
from .rounds import ADJOINT, Message, MessageValidator, check_contributions


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class _Aggregate(Function):
    @staticmethod
    def forward(ctx, transport: LocalTransport, name: str, parties: tuple[int, ...], *contributions: Tensor):
        ctx.transport, ctx.name, ctx.parties = transport, name, parties
        transport._enter(name, tuple(contributions[0].shape), aggregate=True, sender=parties[0])
        transport._shadow(name, parties, contributions)
        for party, value in zip(parties, contributions, strict=True):
            if party != transport.active_party:
                transport.log.add(name, party, sent=_nbytes(value))
                transport.log.add(name, transport.active_party, received=_nbytes(value), messages=0)
        total = contributions[0].clone()
        for value in contributions[1:]:
            total = total + value
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        transport, name = ctx.transport, ADJOINT[ctx.name]
        transport._enter(name, tuple(grad.shape), aggregate=False)
        for party in ctx.parties:
            if party != transport.active_party:
                transport.log.add(name, transport.active_party, sent=_nbytes(grad))
                transport.log.add(name, party, received=_nbytes(grad), messages=0)
        return (None, None, None, *(grad for _ in ctx.parties))


class _Broadcast(Function):
    @staticmethod
    def forward(ctx, transport: LocalTransport, name: str, parties: tuple[int, ...], value: Tensor):
        ctx.transport, ctx.name, ctx.parties = transport, name, parties
        transport._enter(name, tuple(value.shape), aggregate=False)
        for party in parties:
            if party != transport.active_party:
                transport.log.add(name, transport.active_party, sent=_nbytes(value))
                transport.log.add(name, party, received=_nbytes(value), messages=0)
        return tuple(value.view_as(value) for _ in parties)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        transport, name = ctx.transport, ADJOINT[ctx.name]
        transport._enter(name, tuple(grads[0].shape), aggregate=True, sender=ctx.parties[0])
        transport._shadow(name, ctx.parties, grads)
        total = grads[0].clone()
        for grad in grads[1:]:
            total = total + grad
        for party in ctx.parties:
            if party != transport.active_party:
                transport.log.add(name, party, sent=_nbytes(grads[0]))
                transport.log.add(name, transport.active_party, received=_nbytes(grads[0]), messages=0)
        return None, None, None, total


class LocalTransport:
    """Plain, in-process transport: every party and the active party live in this process."""

    protocol = "plain"
    runtime = "local"

    def __init__(self, n_parties: int, active_party: int, log: CommLog | None = None,
                 shadow: list | None = None) -> None:
        self.n_parties = n_parties
        self.active_party = active_party
        # The plaintext shadow for audits: every party's individual contribution to every sum.
        self.shadow = shadow
        self.log = log if log is not None else CommLog()
        self.validator = MessageValidator(n_parties, active_party, "clear")

    def _enter(self, name: str, shape: tuple[int, ...], aggregate: bool, sender: int | None = None) -> None:
        receivers = ((self.active_party,) if aggregate
                     else tuple(k for k in range(self.n_parties) if k != self.active_party))
        sender = self.active_party if sender is None else sender
        self.validator.check(Message(name, sender, receivers, tuple(shape), "float32", "clear"))
        self.log.round(name)

    def _shadow(self, name: str, parties, values) -> None:
        if self.shadow is not None:
            for party, value in zip(parties, values, strict=True):
                self.shadow.append({"round": name, "party": party, "value": value.detach().clone()})

    def aggregate(self, name: str, contributions: Mapping[int, Tensor]) -> Tensor:
        """Sum of every party's contribution, delivered to the active party."""
        parties = tuple(sorted(contributions))
        values = [contributions[k] for k in parties]
        check_contributions(name, parties, values, self.n_parties)
        return _Aggregate.apply(self, name, parties, *values)

    def broadcast(self, name: str, value: Tensor | None, shape: tuple[int, ...] | None = None,
                  parties: tuple[int, ...] | None = None) -> dict[int, Tensor]:
        """One copy of the active party's `value` for each party (`parties`: all by default)."""
        if value is None:
            raise ProtocolError(f"round {name!r}: field 'payload': the active party has nothing to broadcast")
        if shape is not None and tuple(value.shape) != tuple(shape):
            raise ProtocolError(f"round {name!r}: field 'shape': {tuple(value.shape)} != declared {tuple(shape)}")
        parties = tuple(range(self.n_parties)) if parties is None else parties
        return dict(zip(parties, _Broadcast.apply(self, name, parties, value), strict=True))

    def backward(self, loss: Tensor | None) -> None:
        """Run the backward rounds: in one process, autograd drives every adjoint."""
        if loss is not None:
            loss.backward()
