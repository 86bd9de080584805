"""The protocols, registered in one place: what each protects, which processes it needs, and how each
process sets it up (`open`) and, for helper roles such as the `he` aggregator, runs (`serve`).

`Protocol` states the whole contract; the subclasses only declare what differs. Nothing outside this
module asks which protocol it runs: it asks the protocol object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import InputError
from ..secure.identity import PrivateKey
from .distributed import Backend, Peers
from .handshake import Cast, Session
from .views import View


@dataclass
class Membership:
    """Where one process stands once the session is set up: its peers by rank (the present parties, then
    the helpers), the session, the cast and its own identity key (to sign and check the protocol's own
    set-up messages), its X25519 exchange (None for a helper), and the view to record (audits). A helper
    records the first `recorded_rounds` sums (the method's probe step), then hands the view to
    `on_recorded`."""

    peers: Peers
    session: Session
    cast: Cast
    key: PrivateKey
    exchange: object | None = None
    view: View | None = None
    on_recorded: Callable[[View], None] | None = None
    recorded_rounds: int = 0

    @property
    def rank(self) -> int:
        return self.peers.rank

    @property
    def n_parties(self) -> int:
        return self.peers.n_parties

    @property
    def active_index(self) -> int:
        return self.peers.active_index


@dataclass(frozen=True)
class Protocol:
    """A protocol of the aggregate rounds. Broadcasts always travel in clear.

    Class attributes: `name`; `protection` (how a contribution to a sum travels); `runtimes` (where it
    runs: the in-process `local` runtime hosts every party, so only `plain` can run there);
    `hides_contributions` (whether the active party sees only sums); `helpers` (extra roles after the
    K parties, ranks K, K + 1, ...). A secure protocol at K = 2 hides nothing from the active party
    (the sum minus its own contribution is the other party's), so it runs only when acknowledged."""

    name: ClassVar[str]
    protection: ClassVar[str]
    runtimes: ClassVar[tuple[str, ...]] = ("distributed",)
    hides_contributions: ClassVar[bool] = True
    helpers: ClassVar[tuple[str, ...]] = ()

    def world_size(self, parties: int) -> int:
        return parties + len(self.helpers)

    def addend_range(self, parties: int) -> float:
        """The largest |value| one party may contribute to a sum of `parties` addends (the documented range)."""
        return float("inf")

    def role_name(self, rank: int, parties: int) -> str:
        return f"party {rank}" if rank < parties else self.helpers[rank - parties]

    def check_parties(self, parties: int, acknowledged: bool = False,
                      consent: str = "pass --allow-two-party-disclosure") -> None:
        """Refuse 2 parties for a protocol that hides contributions unless acknowledged; `consent` says how."""
        if self.hides_contributions and parties == 2 and not acknowledged:
            raise InputError(f"--protocol {self.name} with 2 parties hides nothing from the active party: the sum "
                             f"minus its own contribution is the other party's. Use 3 or more parties, or {consent} "
                             "to run it anyway")

    def key_agreement(self):
        """This party's side of the session's pairwise key agreement (an ephemeral X25519 key)."""
        from ..secure.masks import X25519Agreement

        return X25519Agreement()

    def open(self, membership: Membership) -> Backend:
        """Set up a party's side of the protocol (collective over the parties); returns its backend."""
        raise NotImplementedError

    def serve(self, membership: Membership) -> None:
        """Run a helper role to its end."""
        raise InputError(f"protocol {self.name} has no helper roles")


@dataclass(frozen=True)
class Plain(Protocol):
    name: ClassVar[str] = "plain"
    protection: ClassVar[str] = "clear"
    runtimes: ClassVar[tuple[str, ...]] = ("local", "distributed")
    hides_contributions: ClassVar[bool] = False

    def open(self, m: Membership) -> Backend:
        from .plain import PlainBackend

        return PlainBackend(m.peers, m.view)


@dataclass(frozen=True)
class Mpc(Protocol):
    """`agreement` makes each party's key-agreement object; tests inject deliberately weak ones (the
    shipped build never sets it)."""

    name: ClassVar[str] = "mpc"
    protection: ClassVar[str] = "secret-shared"
    agreement: object = field(default=None, compare=False)

    def addend_range(self, parties: int) -> float:
        from ..secure.fixed_point import max_safe_abs

        return max_safe_abs(parties)

    def key_agreement(self):
        return self.agreement() if self.agreement is not None else super().key_agreement()

    def open(self, m: Membership) -> Backend:
        from .handshake import pair_keys
        from .mpc import MpcBackend

        return MpcBackend(m.peers, pair_keys(m.session, m.peers.names[m.rank], m.exchange, "secure-sum"), m.view)


@dataclass(frozen=True)
class He(Protocol):
    name: ClassVar[str] = "he"
    protection: ClassVar[str] = "ckks"
    helpers: ClassVar[tuple[str, ...]] = ("aggregator",)

    def addend_range(self, parties: int) -> float:
        from ..secure.ckks import SUM_RANGE

        return SUM_RANGE / parties

    def open(self, m: Membership) -> Backend:
        from ..secure.ckks import load_public_context, make_secret_context, public_context_bytes
        from .handshake import receive_context, send_context
        from .he import HeBackend

        if m.rank != m.active_index:
            public = load_public_context(receive_context(m.peers.network, m.session, m.cast))
            return HeBackend(m.peers, public, None, m.view)
        secret = make_secret_context()
        public = public_context_bytes(secret)
        send_context(m.peers.network, m.key, m.session, public)
        return HeBackend(m.peers, load_public_context(public), secret, m.view)

    def serve(self, m: Membership) -> None:
        from ..secure.ckks import load_public_context
        from .handshake import receive_context
        from .he import serve_aggregator

        context = load_public_context(receive_context(m.peers.network, m.session, m.cast))
        serve_aggregator(m.peers, context, m.view, m.on_recorded, m.recorded_rounds)


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (Plain(), Mpc(), He())}


def protocol_named(name: str | Protocol) -> Protocol:
    """The registered protocol of that name (a `Protocol` is returned as it is)."""
    if isinstance(name, Protocol):
        return name
    if name not in PROTOCOLS:
        raise InputError(f"unknown protocol {name!r}; choose one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]
