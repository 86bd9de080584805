"""The cross-process transport: one process per party, the two primitives over torch.distributed.

Who does what in one stage-1 step (K parties, party `a` is the active party):

| round           | direction                 | payload           | realised by                        |
| --------------- | ------------------------- | ----------------- | ---------------------------------- |
| posterior       | every party -> a (sum)    | (B, 2 d_h)        | backend.sum_to_active              |
| latent          | a -> every party          | (S, B, d_h)       | backend.broadcast                  |
| likelihood      | every party -> a (sum)    | (S, B)            | backend.sum_to_active              |
| likelihood_grad | a -> every party          | (S, B)            | backend.broadcast (adjoint of sum) |
| latent_grad     | every party -> a (sum)    | (S, B, d_h)       | backend.sum_to_active (adjoint)    |
| posterior_grad  | a -> every party          | (B, 2 d_h)        | backend.broadcast (adjoint of sum) |

At the active party both primitives are autograd functions whose backward performs the adjoint
round, so `loss.backward()` drives them in the order autograd needs them (likelihood_grad, then
latent_grad, then posterior_grad). A passive party has no loss: it records its forward rounds and
`backward(None)` replays their adjoints in reverse order, which is the same order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import torch
from torch import Tensor
from torch.autograd import Function

from ..errors import PartyFailure, ProtocolError
from .accounting import CommLog
from .rounds import ADJOINT, Message, MessageValidator, check_contributions


class Backend(Protocol):
    """How sums reach the active party and how the active party's values reach every party."""

    protection: str
    bytes_counter: object  # `.sent` / `.received`: bytes this party put on and took off the wire

    def sum_to_active(self, name: str, value: Tensor) -> Tensor | None:
        """Called by every party with its contribution; the active party gets the sum over all
        parties (its own included), the others None."""

    def broadcast(self, name: str, value: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """The active party's `value` (of `shape`), delivered to every party."""


class _AggregateAtActive(Function):
    @staticmethod
    def forward(ctx, transport: DistributedTransport, name: str, own: Tensor):
        ctx.transport, ctx.name = transport, name
        return transport._sum(name, own).to(own.device)

    @staticmethod
    def backward(ctx, grad: Tensor):
        transport = ctx.transport
        transport._broadcast(ADJOINT[ctx.name], grad.contiguous())
        return None, None, grad


class _BroadcastFromActive(Function):
    @staticmethod
    def forward(ctx, transport: DistributedTransport, name: str, value: Tensor):
        ctx.transport, ctx.name = transport, name
        transport._broadcast(name, value.detach().contiguous())
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, None, ctx.transport._sum(ADJOINT[ctx.name], grad.contiguous()).to(grad.device)


class DistributedTransport:
    """The transport of a process that hosts exactly one party (and maybe the active party)."""

    runtime = "distributed"

    def __init__(self, party: int, n_parties: int, active_party: int, backend: Backend,
                 log: CommLog | None = None, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.party, self.n_parties, self.active_party = party, n_parties, active_party
        self.backend = backend
        self.protocol = getattr(backend, "protocol", "plain")
        self.log = log if log is not None else CommLog()
        self.validator = MessageValidator(n_parties, active_party, backend.protection)
        self._pending: list[tuple[str, str, Tensor]] = []  # passive side: rounds to replay backwards

    @property
    def is_active(self) -> bool:
        return self.party == self.active_party

    # -- the two primitives -------------------------------------------------------------------

    def aggregate(self, name: str, contributions: Mapping[int, Tensor]) -> Tensor | None:
        if set(contributions) != {self.party}:
            raise ProtocolError(f"round {name!r}: field 'sender': this process hosts party {self.party} "
                                f"only, got contributions from {sorted(contributions)}")
        own = contributions[self.party]
        check_contributions(name, [self.party], [own], self.n_parties)
        if self.is_active:
            return _AggregateAtActive.apply(self, name, own)
        self._sum(name, own.detach().contiguous())
        if torch.is_grad_enabled() and own.requires_grad:
            self._pending.append(("aggregate", name, own))
        return None

    def broadcast(self, name: str, value: Tensor | None, shape: tuple[int, ...] | None = None
                  ) -> dict[int, Tensor]:
        if self.is_active:
            if value is None:
                raise ProtocolError(f"round {name!r}: field 'payload': the active party has nothing to send")
            if shape is not None and tuple(value.shape) != tuple(shape):
                raise ProtocolError(f"round {name!r}: field 'shape': {tuple(value.shape)} != declared {shape}")
            return {self.party: _BroadcastFromActive.apply(self, name, value)}
        if shape is None:
            raise ProtocolError(f"round {name!r}: field 'shape': a receiving party needs the declared shape")
        received = self._broadcast(name, None, shape).to(self.device)
        if torch.is_grad_enabled():
            received.requires_grad_(True)
            self._pending.append(("broadcast", name, received))
        return {self.party: received}

    def backward(self, loss: Tensor | None) -> None:
        """Run the adjoint rounds of the last forward pass."""
        if self.is_active:
            if loss is None:
                raise ProtocolError("the active party must provide the loss for the backward rounds")
            loss.backward()
            return
        pending, self._pending = self._pending, []
        for kind, name, tensor in reversed(pending):
            if kind == "aggregate":
                grad = self._broadcast(ADJOINT[name], None, tuple(tensor.shape)).to(tensor.device)
                torch.autograd.backward(tensor, grad)
            else:
                grad = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
                self._sum(ADJOINT[name], grad.detach().contiguous())

    # -- accounting around the backend ---------------------------------------------------------

    def _guard(self, name: str, call, *args):
        """A peer that died or stalls makes gloo raise (closed connection, or the collective
        timeout): report it as a `PartyFailure` that names the round this party was in."""
        try:
            return call(*args)
        except RuntimeError as error:
            if isinstance(error, PartyFailure):
                raise
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            raise PartyFailure(f"round {name!r}: party {self.party} got no answer from a peer ({first})") from error

    def _message(self, name: str, sender: int, shape: tuple[int, ...], aggregate: bool) -> Message:
        receivers = ((self.active_party,) if aggregate
                     else tuple(k for k in range(self.n_parties) if k != self.active_party))
        protection = self.backend.protection if aggregate else "clear"
        return Message(name, sender, receivers, tuple(shape), "float32", protection)

    def _sum(self, name: str, value: Tensor) -> Tensor | None:
        self.validator.check(self._message(name, self.party, tuple(value.shape), aggregate=True))
        return self._accounted(name, self.backend.sum_to_active, name, value)

    def _accounted(self, name: str, call, *args):
        """Run one round through the backend, logging its bytes (from the backend's counter) and time."""
        self.log.round(name)
        counter = self.backend.bytes_counter
        sent0, received0, start = counter.sent, counter.received, time.perf_counter()
        out = self._guard(name, call, *args)
        self.log.add(name, self.party, sent=counter.sent - sent0, received=counter.received - received0,
                     seconds=time.perf_counter() - start)
        return out

    def _broadcast(self, name: str, value: Tensor | None, shape: tuple[int, ...] | None = None) -> Tensor:
        shape = tuple(value.shape) if value is not None else shape
        self.validator.check(self._message(name, self.active_party, shape, aggregate=False))
        out = self._accounted(name, self.backend.broadcast, name, value, shape, torch.float32)
        if tuple(out.shape) != tuple(shape):
            raise ProtocolError(f"round {name!r}: field 'shape': received {tuple(out.shape)}, expected {shape}")
        if not bool(torch.isfinite(out).all()):
            raise ProtocolError(f"round {name!r}: field 'payload': received non-finite values")
        return out
