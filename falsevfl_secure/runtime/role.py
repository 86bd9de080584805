"""The one set-up and tear-down path of a role process, used by the distributed runtime, the long-lived
test sessions, the benchmarks and the federation.

`joined(spec)` connects to the rendezvous store, starts the heartbeat, joins the gloo world, and sets up
the protocol's side of this role (key agreement, context exchange). On the way out everything is undone
in reverse; after a successful run every rank first meets at a barrier (tearing gloo down while a peer
still closes its side can abort the process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ..transport.accounting import CommLog
from ..transport.channel import GlooChannel
from ..transport.distributed import Backend, DistributedTransport
from ..transport.protocols import Membership, Protocol
from ..transport.views import View
from . import liveness


@dataclass(frozen=True)
class RoleSpec:
    """Who this process is in a world: `rank` among `protocol.world_size(n_parties)` roles (ranks below
    `n_parties` are parties), where the rendezvous store is, and whether this process serves it.
    `watch` makes the heartbeat watch the peers (one host per party). `record` records the role's view."""

    rank: int
    n_parties: int
    active_index: int
    protocol: Protocol
    address: str
    port: int
    host_store: bool = False
    watch: bool = False
    record: bool = False

    @property
    def world_size(self) -> int:
        return self.protocol.world_size(self.n_parties)

    @property
    def name(self) -> str:
        return self.protocol.role_name(self.rank, self.n_parties)


@dataclass
class Role:
    spec: RoleSpec
    store: dist.TCPStore
    heartbeat: liveness.Heartbeat
    membership: Membership
    backend: Backend | None = None
    view: View | None = field(default=None)

    @property
    def is_party(self) -> bool:
        return self.spec.rank < self.spec.n_parties

    @property
    def is_active(self) -> bool:
        return self.spec.rank == self.spec.active_index

    def transport(self, device: torch.device | None = None) -> DistributedTransport:
        """A fresh transport over this role's backend (one per training run or session job)."""
        spec = self.spec
        log = CommLog(timed=True)
        transport = DistributedTransport(spec.rank, spec.n_parties, spec.active_index, self.backend, log, device)
        transport.on_round = self.heartbeat.enter
        return transport


@contextlib.contextmanager
def joined(spec: RoleSpec, store: dist.TCPStore | None = None, on_stall=None) -> Iterator[Role]:
    """Join the world as `spec.rank` and set up the protocol; undone in reverse on exit. `store` is this
    process's connection to the rendezvous store when it already has one."""
    store = store or liveness.connect_store(spec.address, spec.port, host=spec.host_store)
    heartbeat = liveness.Heartbeat(spec.address, spec.port, spec.rank, spec.world_size, spec.watch, on_stall).start()
    dist.init_process_group("gloo", store=dist.PrefixStore("world/", store), rank=spec.rank,
                            world_size=spec.world_size, timeout=timedelta(seconds=liveness.COLLECTIVE_TIMEOUT_S))
    role, clean = None, False
    try:
        role = _set_up(spec, store, heartbeat)
        yield role
        clean = True
    finally:
        _tear_down(role, clean)
        heartbeat.stop()


def _set_up(spec: RoleSpec, store: dist.TCPStore, heartbeat: liveness.Heartbeat) -> Role:
    """The parties' group (the world itself unless the protocol has helper roles), a byte channel over
    the world, and this party's backend (helpers have none: `protocol.serve` runs them)."""
    parties = list(range(spec.n_parties))
    group = dist.new_group(parties) if spec.world_size > spec.n_parties else None
    view = View() if spec.record else None
    membership = Membership(spec.rank, spec.n_parties, spec.active_index, group, GlooChannel(), view)
    role = Role(spec, store, heartbeat, membership, view=view)
    if role.is_party:
        role.backend = spec.protocol.open(membership)
    return role


def _tear_down(role: Role | None, clean: bool) -> None:
    if role is not None and role.backend is not None:
        with contextlib.suppress(*(() if clean else (RuntimeError, OSError))):  # after a failure peers may be gone
            role.backend.close()
    if clean and dist.is_initialized():
        with contextlib.suppress(RuntimeError):
            dist.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
