"""The cross-process transport: one process per party, each round carried by the protocol's backend.

At the active party both primitives are autograd functions whose backward applies the adjoint
primitive (as in `torch.distributed.nn.functional`), so `loss.backward()` drives the adjoint rounds in
the order autograd needs them. A passive party has no loss: it remembers its forward rounds and
`backward` replays their adjoints in reverse, which is the same order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from torch.autograd import Function

from ..errors import PartyFailure, ProtocolError
from ..placement import Active
from .accounting import CommLog
from .rounds import Message, MessageValidator, Round, check_contributions
from .views import View


@dataclass
class ByteCounter:
    sent: int = 0
    received: int = 0


class Backend(Protocol):
    """How one protocol carries the two primitives between processes (`transport.protocols` opens one)."""

    protection: str
    counter: ByteCounter
    view: View | None  # what this party received and sent, when an audit records it

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        """Called by every party with its contribution; the active party gets the sum over all parties
        (its own included), the others None."""

    def broadcast(self, round: Round, value: Tensor | None, shape: tuple[int, ...]) -> Tensor:
        """The active party's `value` (of `shape`), delivered to every party."""

    def close(self) -> None: ...


class _SumAtActive(Function):
    @staticmethod
    def forward(ctx, transport: DistributedTransport, round: Round, own: Tensor):
        ctx.transport, ctx.round = transport, round
        return transport.sum(round, own).to(own.device)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, None, _SendFromActive.apply(ctx.transport, ctx.round.adjoint, grad.contiguous())


class _SendFromActive(Function):
    @staticmethod
    def forward(ctx, transport: DistributedTransport, round: Round, value: Tensor):
        ctx.transport, ctx.round = transport, round
        transport.send(round, value.detach().contiguous())
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, None, _SumAtActive.apply(ctx.transport, ctx.round.adjoint, grad.contiguous())


class DistributedTransport:
    """The transport of a process that hosts exactly one party (and maybe the active party)."""

    runtime = "distributed"

    def __init__(self, party: int, n_parties: int, active_index: int, backend: Backend, log: CommLog | None = None,
                 device: torch.device | None = None) -> None:
        self.party, self.n_parties, self.active_index = party, n_parties, active_index
        self.backend, self.device = backend, device or torch.device("cpu")
        self.log = log if log is not None else CommLog(timed=True)
        self.validator = MessageValidator(n_parties, active_index, backend.protection)
        self._pending: list[tuple[Round, Tensor]] = []  # passive side: rounds to replay backwards
        self.on_round: Callable[[str], None] | None = None  # told the round before it starts (liveness)

    @property
    def is_active(self) -> bool:
        return self.party == self.active_index

    def aggregate(self, round: Round, contributions: Mapping[int, Tensor]) -> Active[Tensor]:
        if set(contributions) != {self.party}:
            raise ProtocolError(f"round {round.name!r}: field 'sender': this process hosts party {self.party} "
                                f"only, got contributions from {sorted(contributions)}")
        own = contributions[self.party]
        check_contributions(round, [self.party], [own], self.n_parties)
        if self.is_active:
            return Active(_SumAtActive.apply(self, round, own))
        self.sum(round, own.detach().contiguous())
        if torch.is_grad_enabled() and own.requires_grad:
            self._pending.append((round, own))
        return Active.absent()

    def broadcast(self, round: Round, value: Active[Tensor], shape: tuple[int, ...]) -> dict[int, Tensor]:
        if self.is_active:
            if tuple(value.get().shape) != tuple(shape):
                raise ProtocolError(f"round {round.name!r}: field 'shape': {tuple(value.get().shape)} "
                                    f"!= declared {tuple(shape)}")
            return {self.party: _SendFromActive.apply(self, round, value.get())}
        received = self.receive(round, shape)
        if torch.is_grad_enabled():
            received.requires_grad_(True)
            self._pending.append((round, received))
        return {self.party: received}

    def backward(self, loss: Active[Tensor]) -> None:
        """Run the adjoint rounds of the last forward pass."""
        if self.is_active:
            loss.get().backward()
            return
        pending, self._pending = self._pending, []
        for round, tensor in reversed(pending):
            if round.is_aggregate:  # the gradient of a sum comes back as a broadcast
                torch.autograd.backward(tensor, self.receive(round.adjoint, tuple(tensor.shape)))
            else:  # the gradient of a broadcast goes back into a sum
                grad = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
                self.sum(round.adjoint, grad.detach().contiguous())

    # -- one round through the backend, validated and accounted --------------------------------------

    def sum(self, round: Round, value: Tensor) -> Tensor | None:
        self._check(round, self.party, tuple(value.shape))
        peak = float(value.abs().max()) if value.numel() else 0.0
        self.log.add(round.name, self.party, messages=0, peak=peak)  # how close to the protocol's range
        return self._accounted(round, self.backend.sum_to_active, round, value)

    def send(self, round: Round, value: Tensor) -> None:
        self._check(round, self.active_index, tuple(value.shape))
        self._accounted(round, self.backend.broadcast, round, value, tuple(value.shape))

    def receive(self, round: Round, shape: tuple[int, ...]) -> Tensor:
        self._check(round, self.active_index, shape)
        out = self._accounted(round, self.backend.broadcast, round, None, shape)
        if tuple(out.shape) != tuple(shape):
            raise ProtocolError(f"round {round.name!r}: field 'shape': received {tuple(out.shape)}, expected {shape}")
        if not bool(torch.isfinite(out).all()):
            raise ProtocolError(f"round {round.name!r}: field 'payload': received non-finite values")
        return out.to(self.device)

    def _check(self, round: Round, sender: int, shape: tuple[int, ...]) -> None:
        protection = self.backend.protection if round.is_aggregate else "clear"
        receivers = round.receivers(self.n_parties, self.active_index)
        self.validator.check(Message(round.name, sender, receivers, shape, "float32", protection))

    def _accounted(self, round: Round, call, *args):
        """Run one round through the backend, logging its bytes and time; a peer that died or stalled
        makes gloo raise, reported as a `PartyFailure` naming the round."""
        self.log.round(round.name)
        if self.on_round is not None:
            self.on_round(round.name)
        counter = self.backend.counter
        sent0, received0, start = counter.sent, counter.received, time.perf_counter()
        try:
            out = call(*args)
        except RuntimeError as error:
            if isinstance(error, PartyFailure):
                raise
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            raise PartyFailure(f"round {round.name!r}: party {self.party} got no answer from a peer "
                               f"({first})") from error
        self.log.add(round.name, self.party, sent=counter.sent - sent0, received=counter.received - received0,
                     seconds=time.perf_counter() - start)
        return out
