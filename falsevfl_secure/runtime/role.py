"""The one set-up and tear-down path of a role process, for every way a run starts: simulated worlds,
test sessions, benchmarks and one host per party.

A `RoleSpec` says who this process is (its name, the cast of the run with their pinned keys, its own
identity key file, the agreement derived from its own configuration, what it was asked to do, and how it
is linked). `Role.serve()` opens its hub (if it has one) and returns the port; `Role.join()` dials the
hubs it needs, runs the session set-up (`network.handshake`: roster, signed keys) and the protocol's
own set-up; `Role.leave()` undoes everything (after a clean run, through the goodbye barrier).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import PartyFailure
from ..network.agreement import Agreement
from ..network.channel import PairChannel
from ..network.handshake import Cast, Handshake, Request, Session, pair_keys
from ..network.network import Blame, Network, Plan
from ..network.peers import Peers
from ..network.wire import Refused
from ..secure.align import alignment_bounds
from ..secure.identity import read_private_key
from ..transport.accounting import CommLog
from ..transport.cross_process import Backend, DistributedTransport
from ..transport.protocols import Membership, Protocol, protocol_named
from ..transport.rounds import VOCABULARY
from ..transport.views import View
from .losses import PartyLoss, tolerated


@dataclass(frozen=True)
class RoleSpec:
    """Who this process is in a run. `protocol` is the protocol object this role's own configuration asks
    for (tests may pass a weakened one); `record` makes the role keep its view (audits)."""

    name: str
    cast: Cast
    protocol: Protocol
    agreement: Agreement
    request: Request
    plan: Plan
    key_path: str
    record: bool = False

    @property
    def is_party(self) -> bool:
        return self.name in self.cast.parties


class Role:
    """One process's place in a run, from `serve()` to `leave()`. `network_class` and `handshake_class` are
    what it runs on; the attack tests subclass a role to model a weakened or malicious participant."""

    network_class = Network
    handshake_class = Handshake

    def __init__(self, spec: RoleSpec, parent=None) -> None:
        self.spec, self.parent = spec, parent  # parent: the pipe to the process that started this one, if any
        self.view = View() if spec.record else None
        self.key = read_private_key(spec.key_path)
        self.network = self.network_class(spec.name, self.key, spec.cast.pins, spec.plan, self._record_control)
        self.network.min_deadline_s = spec.request.round_deadline_s
        self.network.tighten(self._alignment_bounds(spec))  # before any link is up: its own file's max_ids
        self.session: Session | None = None
        self.membership: Membership | None = None
        self.backend: Backend | None = None
        self.rejoined_at: tuple[int, int] | None = None  # a returning party: the (stage, epoch) it was readmitted at

    def _record_control(self, src: str, tag: str, payload: bytes) -> None:
        """Every message this role receives that is not a round (the backend records those) enters its
        view: the audit checks everything a role received."""
        if self.view is not None and tag not in ROUND_NAMES:
            names = self.peers.names if self.membership is not None else ()
            self.view.add(tag, "control", names.index(src) if src in names else -1, "clear", payload)

    def serve(self) -> int | None:
        return self.network.serve()

    def join(self, addresses: dict[str, str] | None = None) -> Role:
        spec = self.spec
        self.network.connect(time.monotonic() + spec.request.join_timeout_s, addresses)
        self.handshake = self.handshake_class(self.network, spec.name, self.key, spec.agreement, spec.cast,
                                              spec.request, spec.protocol.hides_contributions)
        where = None  # a returning party: where the active party readmitted it
        if spec.request.rejoin:
            session, exchange, where = self.handshake.rejoin(spec.protocol.key_agreement)
        else:
            session, exchange = self.handshake.run(spec.protocol.key_agreement)
        names = (*session.present, *([session.aggregator] if session.aggregator else []))
        peers = Peers(self.network, names, names.index(spec.name), len(session.present), session.active_index)
        peers.lose(names.index(name) for name in (where or {}).get("lost", ()))
        self.session = session
        self.membership = Membership(peers, session, spec.cast, self.key, exchange, self.view)
        self.network.coordinator, self.network.tolerated = session.active, tolerated(self)
        # A returning party counts its own return when the epoch frame that readmits it comes (`at_epoch`).
        since = (where["version"] - 1, where["chain"], where["plan"]) if where else ()  # told, signed, on its return
        self.losses = PartyLoss(self, *since) if self.network.tolerated and spec.is_party else None
        self.rejoined_at = None if where is None else (where["stage"], where["epoch"])
        if where is not None:
            self.losses._check_policy()  # its own file: never fewer parties, nor two, than it consents to
        if spec.is_party:
            self.backend = self.protocol.open(self.membership)
        return self

    @staticmethod
    def _alignment_bounds(spec: RoleSpec) -> dict[str, int]:
        """The alignment's frame bounds from this role's own file: none for a helper, which never aligns."""
        if spec.name not in spec.cast.parties:
            return {"align": 0, "kept": 0}
        max_ids = spec.agreement.fields.get("max_ids")
        return {} if max_ids is None else alignment_bounds(int(max_ids), len(spec.cast.parties))

    @property
    def protocol(self) -> Protocol:
        """The protocol that runs: this role's own object, or plain when the active party is alone."""
        name = self.session.protocol
        return self.spec.protocol if name == self.spec.protocol.name else protocol_named(name)

    @property
    def peers(self) -> Peers:
        return self.membership.peers

    @property
    def rank(self) -> int:
        return self.peers.rank

    @property
    def is_party(self) -> bool:
        return self.spec.is_party

    @property
    def is_active(self) -> bool:
        return self.spec.name == self.spec.cast.active

    def transport(self, device: torch.device | None = None) -> DistributedTransport:
        """A fresh transport over this role's backend (one per training run or session job)."""
        peers = self.peers
        transport = DistributedTransport(peers.rank, peers.n_parties, peers.active_index, self.backend, self.network,
                                         CommLog(timed=True), device)
        transport.on_party_lost = getattr(self, "losses", None)  # None: a lost party ends the run
        return transport

    def channel(self, tag: str = "align") -> PairChannel:
        """Byte frames among the present parties (the alignment), sealed where the active party relays."""
        keys = pair_keys(self.session, self.spec.name, self.membership.exchange, "pair-channel")
        return PairChannel(self.peers, keys, tag)

    def serve_helper(self) -> None:
        """A helper role (the he aggregator) runs its protocol until the parties are done."""
        self.protocol.serve(self.membership)

    def fail(self, error: BaseException) -> None:
        """Tell every peer this role stopped (its error type only: the text stays here), or, where its program
        refused a peer's frame, who that peer is (red team: the others read that this role failed)."""
        if isinstance(error, Refused) and error.offender not in (None, self.spec.name):
            self.network.refuse(error)
            return
        self.network.fail(Blame(self.spec.name, "failed", self.network.round, type(error).__name__))

    def leave(self, clean: bool) -> None:
        if clean and self.is_active and getattr(self, "losses", None) is not None:
            try:
                self.losses.close()
            except PartyFailure:
                pass  # a returning party that left meanwhile: nothing to tell it
        if self.backend is not None:
            self.backend.close(clean)
        self.network.close(clean)


ROUND_NAMES = frozenset(r.name for r in VOCABULARY)


def key_file(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}.key"
