"""The cross-process transport: one process per party, every round carried by its protocol's backend.

Every role calls the same autograd Function for a round, as every rank does in
`torch.distributed.nn.functional`: its forward runs the round (the active party gets the sum or sends
the broadcast; a passive party sends its contribution or receives the broadcast) and its backward runs
the round's adjoint. A passive party has no loss, so each Function also threads an ordering token from
round to round; `backward` at a passive party starts from the last token, and autograd then reaches the
adjoints in exactly the reverse order of the forward rounds, as at the active party (where the token
joins the loss, so an output the loss does not use still gets its adjoint). A round is validated once,
its bytes are counted once (the network reports them), and its entries are recorded once (the backend).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch
from torch import Tensor
from torch.autograd import Function

from ..errors import ProtocolError
from ..network.network import Network
from ..placement import Active
from .accounting import CommLog
from .moments import gradient_from_moments, sample_moments
from .rounds import MessageValidator, Round, RoundTable, largest
from .views import View


class Backend(Protocol):
    """How one protocol carries the two primitives between processes (`transport.protocols` opens one)."""

    protection: str
    view: View | None  # what this party received and sent, when an audit records it

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        """Called by every party with its contribution; the active party gets the sum over all parties
        (its own included), the others None."""

    def broadcast(self, round: Round, value: Tensor | None, shape: tuple[int, ...]) -> Tensor:
        """The active party's `value` (of `shape`), delivered to every party."""

    def wire_bytes(self, round: Round, numel: int) -> int:
        """The most bytes one frame of `round` with `numel` values takes under this protocol."""

    def declare(self, values: dict[str, int]) -> None:
        """At the active party: each sum's largest number of values, to a helper that combines (if any)."""

    def close(self, clean: bool = True) -> None:
        """Release this role's own resources; when `clean`, also tell its helpers that it is done."""


class _Sum(Function):
    """A sum at any role: forward sums the parties' contributions to the active party; backward broadcasts
    the gradient of the sum back to every party (its adjoint). `token` orders the rounds."""

    @staticmethod
    def forward(ctx, transport: DistributedTransport, round: Round, token: Tensor, value: Tensor):
        """The sum round itself: the active party gets the sum of every party's `value`, the others an empty
        tensor."""
        ctx.transport, ctx.round, ctx.shape = transport, round, tuple(value.shape)
        total = transport._run(round, value, transport.backend.sum_to_active, round, value)
        out = total.to(device=value.device, dtype=value.dtype) if transport.is_active else value.new_zeros(0)
        if not torch.is_grad_enabled() and round.name in transport._pass_ends:
            transport.network.between_passes()  # a pass without adjoints (stage 2, predictions) ends here
        return out, token.clone()

    @staticmethod
    def backward(ctx, grad: Tensor | None, grad_token: Tensor | None):
        return None, None, grad_token, ctx.transport.sum_adjoint(ctx.round, grad, ctx.shape)


class _Broadcast(Function):
    """A broadcast at any role: forward delivers the active party's value to every party; backward sums the
    parties' gradients back to the active party (its adjoint), or their two sample moments for a broadcast
    of reparameterised samples (`transport.moments`). `token` orders the rounds."""

    @staticmethod
    def forward(ctx, transport: DistributedTransport, round: Round, token: Tensor, value: Tensor):
        ctx.transport, ctx.round, ctx.shape = transport, round, transport.declared(round)
        out = transport.deliver(round, value)
        ctx.samples = (value if transport.is_active else out).detach() if round.moments_adjoint else None
        return out, token.clone()

    @staticmethod
    def backward(ctx, grad: Tensor | None, grad_token: Tensor | None):
        if ctx.samples is not None:
            return None, None, grad_token, ctx.transport.moments_adjoint(ctx.round, grad, ctx.samples)
        return None, None, grad_token, ctx.transport.broadcast_adjoint(ctx.round, grad, ctx.shape)


class DistributedTransport:
    """The transport of a process that hosts exactly one party (and maybe the active party)."""

    runtime = "distributed"

    def __init__(self, party: int, n_parties: int, active_index: int, backend: Backend, network: Network,
                 log: CommLog | None = None, device: torch.device | None = None) -> None:
        self.party, self.n_parties, self.active_index = party, n_parties, active_index
        self.backend, self.network, self.device = backend, network, device or torch.device("cpu")
        self.log = log if log is not None else CommLog(timed=True)
        self.validator = MessageValidator(n_parties, active_index, backend.protection)
        self.table: RoundTable | None = None
        self.on_party_lost = None  # the role's handler when the run survives a lost party (runtime.losses)
        self._token: Tensor | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}  # the forward shape of each round of this pass
        self._pass_ends: set[str] = set()  # rounds after which a pass without adjoints is over
        self.is_active = party == active_index
        self.absent = Active.absent()  # what every sum returns where the active party is not hosted (one object)

    def use_noise(self, stages: Mapping[int, object]) -> None:
        """This party's sums through its noise stage (differential privacy; empty: none)."""
        self.backend.use_noise(stages.get(self.party))

    def use(self, table: RoundTable, sizes: Mapping[str, int] | None = None) -> None:
        """Run the rounds of this method's table (the validator checks every message against it); `sizes`
        bounds each size name of the rounds' payloads (B, S, H, ...), so the network refuses a larger frame."""
        self.table = table
        self.validator.use(table)
        backward = {r.name for p in table.passes for i, r in enumerate(p) if r.adjoint in p[:i]}
        firsts = {r.name for r in table.firsts}
        self._pass_ends = {name for name, after in table.successors().items()
                           if name is not None and set(after) - backward <= firsts}
        if sizes is not None:
            self.network.allow(self.bounds(table, sizes))
            self.backend.declare({r.name: largest(r, sizes) for r in table.rounds if r.is_aggregate})

    def bounds(self, table: RoundTable, sizes: Mapping[str, int]) -> dict[str, int]:
        """Each round's largest frame in bytes under this protocol (`wire_bytes`), for the network."""
        return {r.name: self.backend.wire_bytes(r, largest(r, sizes)) for r in table.rounds}

    def aggregate(self, round: Round, contributions: Mapping[int, Tensor]) -> Active[Tensor]:
        if set(contributions) != {self.party}:
            raise ProtocolError(f"round {round.name!r}: field 'sender': this process hosts party {self.party} "
                                f"only, got contributions from {sorted(contributions)}")
        if round in self.validator.firsts or self._token is None:  # a new pass: a fresh token
            self._token = torch.zeros((), requires_grad=torch.is_grad_enabled())
        out, self._token = _Sum.apply(self, round, self._token, contributions[self.party])  # the cipher refuses
        return Active(out) if self.is_active else self.absent  # a value it cannot carry

    def broadcast(self, round: Round, value: Active[Tensor], shape: tuple[int, ...]) -> dict[int, Tensor]:
        if self.is_active and tuple(value.get().shape) != tuple(shape):
            raise ProtocolError(f"round {round.name!r}: field 'shape': {tuple(value.get().shape)} "
                                f"!= declared {tuple(shape)}")
        self._shapes[round.name] = tuple(shape)
        if round in self.validator.firsts or self._token is None:  # a new pass: a fresh token
            self._token = torch.zeros((), requires_grad=torch.is_grad_enabled())
        own = value.get() if self.is_active else torch.zeros(0)
        out, self._token = _Broadcast.apply(self, round, self._token, own)
        return {self.party: out}

    def abandon(self) -> None:
        """Forget the pass in flight (a party left during it): the next round opens a new pass."""
        self.validator.reset()
        self._token, self._shapes = None, {}

    def working(self) -> None:
        """One unit of this role's own work between passes is done (`Network.advanced`)."""
        self.network.advanced()

    def allow_work(self, units: int) -> None:
        """How many units of a peer's own work this role's waits accept in all (`Network.allow_work`)."""
        self.network.allow_work(units)

    def backward(self, loss: Active[Tensor], local: Sequence[Tensor] = ()) -> None:
        """Run the adjoint rounds of the last forward pass (every role: the same Functions' backward),
        together with this process's own local losses (`local`: objectives that never leave it)."""
        roots = [*([loss.get()] if self.is_active else []), *local]
        grads = [torch.ones_like(r) for r in roots]
        if self._token is not None:
            roots, grads = [*roots, self._token], [*grads, torch.zeros(())]
        kept = [(r, g) for r, g in zip(roots, grads, strict=True) if r.requires_grad]
        if kept:  # a pass run without gradients (stage 2's frozen rounds) has no adjoint to run
            torch.autograd.backward([r for r, _ in kept], [g for _, g in kept])
        self._token = None
        self.network.between_passes()

    # -- one round: validated, run, counted ------------------------------------------------------------

    def deliver(self, round: Round, value: Tensor) -> Tensor:
        """A broadcast round: every party gets the active party's `value` (of the declared shape)."""
        shape = self.declared(round)
        out = self._run(round, shape, self.backend.broadcast, round, value if self.is_active else None, shape)
        out = value.view_as(value) if self.is_active else self._received(round, out, shape)
        if not torch.is_grad_enabled() and round.name in self._pass_ends:
            self.network.between_passes()
        return out

    def sum_adjoint(self, round: Round, grad: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
        """The adjoint of a sum: the gradient of the sum, broadcast back to every party."""
        adjoint = round.adjoint
        out_shape = shape if not self.is_active else tuple(grad.shape)
        sent = grad.contiguous() if self.is_active else None
        out = self._run(adjoint, out_shape, self.backend.broadcast, adjoint, sent, out_shape)
        return grad if self.is_active else self._received(adjoint, out, out_shape)

    def broadcast_adjoint(self, round: Round, grad: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
        """The adjoint of a broadcast: the parties' gradients, summed back to the active party."""
        own = (grad if grad is not None else torch.zeros(shape, device=self.device)).contiguous()
        total = self._run(round.adjoint, own, self.backend.sum_to_active, round.adjoint, own)
        return total.to(device=own.device, dtype=own.dtype) if self.is_active else None

    def moments_adjoint(self, round: Round, grad: Tensor | None, samples: Tensor) -> Tensor | None:
        """The adjoint of a broadcast of samples h: every party sends its gradient's two sample moments
        (`transport.moments`) into the sum; the active party turns the summed moments into a gradient."""
        own = sample_moments(grad if grad is not None else torch.zeros_like(samples), samples).contiguous()
        total = self._run(round.adjoint, own, self.backend.sum_to_active, round.adjoint, own)
        if not self.is_active:
            return None
        return gradient_from_moments(total.to(device=samples.device, dtype=samples.dtype), samples)

    def declared(self, round: Round) -> tuple[int, ...]:
        """The declared shape of the broadcast `round` in this pass."""
        return self._shapes[round.name]

    def _received(self, round: Round, out: Tensor, shape: tuple[int, ...]) -> Tensor:
        if tuple(out.shape) != tuple(shape):
            raise ProtocolError(f"round {round.name!r}: field 'shape': received {tuple(out.shape)}, expected {shape}")
        if not bool(torch.isfinite(out).all()):
            raise ProtocolError(f"round {round.name!r}: field 'payload': received non-finite values")
        return out.to(self.device)

    def _run(self, round: Round, payload: Tensor | tuple[int, ...], call, *args):
        """The one path of every round: validated once, run through the backend, counted and traced once.
        `payload` is a sum's own contribution (its shape and its peak are taken from it) or a broadcast's shape."""
        contribution = payload if round.is_aggregate else None
        shape = tuple(payload.shape) if contribution is not None else payload
        self.validator.check_own(round, shape)
        network = self.network
        network.enter(round.name)
        traffic, waited, start = network.traffic[round.name], network.waited, time.perf_counter()
        sent, received = traffic
        out = call(*args)
        peak = float(contribution.detach().abs().max()) if contribution is not None and contribution.numel() else 0.0
        self.log.ran(round.name, self.party, traffic[0] - sent, traffic[1] - received, time.perf_counter() - start,
                     network.waited - waited, peak, started=start)
        return out
