"""The in-process transport of the local runtime: all parties live in one process, sums in clear.

It is the plaintext reference that every distributed and secure transport must reproduce. Both
primitives are autograd functions whose backward applies the adjoint primitive, as in
`torch.distributed.nn.functional`: the backward of `_Aggregate` is a `_Broadcast` of the gradient, the
backward of `_Broadcast` an `_Aggregate` of the gradients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torch.autograd import Function

from ..errors import ProtocolError
from ..placement import Active
from ..secure.fixed_point import round_to_grid
from .accounting import CommLog
from .base import nbytes
from .moments import gradient_from_moments, sample_moments
from .rounds import Message, MessageValidator, Round, RoundTable, check_contributions
from .views import View


class _Aggregate(Function):
    @staticmethod
    def forward(ctx, transport: LocalTransport, round: Round, parties: tuple[int, ...], *contributions: Tensor):
        ctx.transport, ctx.round, ctx.parties = transport, round, parties
        transport._enter(round, contributions[0], parties, contributions)
        contributions = transport.noised(round, parties, contributions)
        total = contributions[0].clone()
        for value in contributions[1:]:  # in party order, exactly as the distributed plain sum
            total = total + value
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        return (None, None, None, *_Broadcast.apply(ctx.transport, ctx.round.adjoint, ctx.parties, grad))


class _Broadcast(Function):
    @staticmethod
    def forward(ctx, transport: LocalTransport, round: Round, parties: tuple[int, ...], value: Tensor):
        ctx.transport, ctx.round, ctx.parties = transport, round, parties
        ctx.value = value.detach() if round.moments_adjoint else None
        transport._enter(round, value, parties)
        return tuple(value.view_as(value) for _ in parties)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        if ctx.value is None:
            return None, None, None, _Aggregate.apply(ctx.transport, ctx.round.adjoint, ctx.parties, *grads)
        moments = [sample_moments(g, ctx.value) for g in grads]  # each party's, as the distributed one sends
        total = _Aggregate.apply(ctx.transport, ctx.round.adjoint, ctx.parties, *moments)
        return None, None, None, gradient_from_moments(total, ctx.value)


class LocalTransport:
    """Every party and the active party in one process. `record`, when given, receives every party's
    own contribution to every sum (the plaintext truth the audits and attack tests compare against)."""

    protection = "clear"
    runtime = "local"

    def __init__(self, n_parties: int, active_index: int, log: CommLog | None = None,
                 record: View | None = None, on_grid: bool = False) -> None:
        self.n_parties, self.active_index = n_parties, active_index
        self.on_grid = on_grid  # each addend as mpc and he encode it (the plain reference of their sums)
        self.log = log if log is not None else CommLog()
        self.record = record
        self.validator = MessageValidator(n_parties, active_index, self.protection)
        self.stages: Mapping[int, object] = {}

    def use_noise(self, stages: Mapping[int, object]) -> None:
        """Each hosted party's sums through its own noise stage (`ciphers.noise.NoiseStage`; empty: none)."""
        self.stages = dict(stages)

    def noised(self, round: Round, parties: tuple[int, ...], values: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """The contributions as the parties' noise stages leave them, on the fixed-point grid where `on_grid`
        (the gradient passes straight through)."""
        if self.stages:
            values = tuple(self.stages[k].apply(round, v, self.n_parties).to(v.dtype)
                           for k, v in zip(parties, values, strict=True))
        return tuple(round_to_grid(v).to(v.dtype) for v in values) if self.on_grid else values

    def use(self, table: RoundTable, sizes=None) -> None:
        """Run the rounds of this method's table (the validator checks every message against it)."""
        self.validator.use(table)

    def abandon(self) -> None:
        """Forget the pass in flight (a party left during it): the next round opens a new pass."""
        self.validator.reset()

    def working(self) -> None:
        """One unit of work between passes is done: no peer waits on it in one process."""

    def allow_work(self, units: int) -> None:
        """No peer waits across processes here."""

    def aggregate(self, round: Round, contributions: Mapping[int, Tensor]) -> Active[Tensor]:
        parties = tuple(sorted(contributions))
        values = [contributions[k] for k in parties]
        check_contributions(round, parties, values, self.n_parties)
        return Active(_Aggregate.apply(self, round, parties, *values))

    def broadcast(self, round: Round, value: Active[Tensor], shape: tuple[int, ...]) -> dict[int, Tensor]:
        tensor = value.get()
        if tuple(tensor.shape) != tuple(shape):
            raise ProtocolError(f"round {round.name!r}: field 'shape': {tuple(tensor.shape)} "
                                f"!= declared {tuple(shape)}")
        parties = tuple(range(self.n_parties))
        return dict(zip(parties, _Broadcast.apply(self, round, parties, tensor), strict=True))

    def backward(self, loss: Active[Tensor], local: Sequence[Tensor] = ()) -> None:
        """The active party's loss and every party's local losses, back through every adjoint round (in one
        process autograd drives them all)."""
        roots = [r for r in (loss.get(), *local) if r.requires_grad]
        if roots:
            torch.autograd.backward(roots, [torch.ones_like(r) for r in roots])

    def _enter(self, round: Round, value: Tensor, parties: tuple[int, ...], sent: tuple[Tensor, ...] = ()) -> None:
        """Validate and account one round: each passive party's message to or from the active party."""
        sender = parties[0] if round.is_aggregate else self.active_index
        receivers = round.receivers(self.n_parties, self.active_index)
        self.validator.check(Message(round.name, sender, receivers, tuple(value.shape), "float32", self.protection))
        self.log.round(round.name)
        for i, party in enumerate(parties):
            peak = float(sent[i].detach().abs().max()) if sent and sent[i].numel() else 0.0
            if party != self.active_index:
                src, dst = (party, self.active_index) if round.is_aggregate else (self.active_index, party)
                self.log.add(round.name, src, sent=nbytes(value), peak=peak)
                self.log.add(round.name, dst, received=nbytes(value), messages=0)
            elif peak:
                self.log.add(round.name, party, messages=0, peak=peak)
        for party, contribution in zip(parties, sent, strict=False):
            if self.record is not None:
                self.record.add(round.name, "sent", party, self.protection, contribution)
