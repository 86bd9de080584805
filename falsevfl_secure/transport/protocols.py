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
from .distributed import Backend
from .views import View


@dataclass
class Membership:
    """Where one process stands: its rank, the parties, the parties' process group (ranks 0..K-1;
    None when the world is exactly the parties), a byte channel over the whole world, and the view to
    record (audits). A helper records the rounds of one step, then hands the view to `on_recorded`."""

    rank: int
    n_parties: int
    active_index: int
    group: object = None
    channel: object = None
    view: View | None = None
    on_recorded: Callable[[View], None] | None = None


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

        return PlainBackend(m.rank, m.n_parties, m.active_index, m.group, m.view)


@dataclass(frozen=True)
class Mpc(Protocol):
    """`agreement` makes each party's key-agreement object; tests inject deliberately weak ones."""

    name: ClassVar[str] = "mpc"
    protection: ClassVar[str] = "secret-shared"
    agreement: object = field(default=None, compare=False)

    def addend_range(self, parties: int) -> float:
        from ..secure.fixed_point import max_safe_abs

        return max_safe_abs(parties)

    def open(self, m: Membership) -> Backend:
        from .mpc import MpcBackend

        agreement = self.agreement() if self.agreement is not None else None
        return MpcBackend(m.rank, m.n_parties, m.active_index, m.group, m.view, agreement=agreement)


@dataclass(frozen=True)
class He(Protocol):
    name: ClassVar[str] = "he"
    protection: ClassVar[str] = "ckks"
    helpers: ClassVar[tuple[str, ...]] = ("aggregator",)

    def addend_range(self, parties: int) -> float:
        from ..secure.ckks import SUM_RANGE

        return SUM_RANGE / parties

    def open(self, m: Membership) -> Backend:
        from .he import HeBackend

        return HeBackend(m.rank, m.n_parties, m.active_index, m.group, m.view, channel=m.channel)

    def serve(self, m: Membership) -> None:
        from .he import serve_aggregator

        serve_aggregator(m.channel, m.n_parties, m.active_index, m.view, m.on_recorded)


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (Plain(), Mpc(), He())}


def protocol_named(name: str | Protocol) -> Protocol:
    """The registered protocol of that name (a `Protocol` is returned as it is)."""
    if isinstance(name, Protocol):
        return name
    if name not in PROTOCOLS:
        raise InputError(f"unknown protocol {name!r}; choose one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]
