"""The cast of a run on one machine: identities, pins, the agreement and every role's spec.

A federation builds these from each party's own federation.toml (`federation.launch`); a simulation,
a test world or a benchmark is one operator's run of every role, so `local_specs` makes a fresh identity
per role (each key in its own owner-only file, read only by that role's process), pins them all, and
links the roles as a federation is linked: the active party's hub serves the parties, the he
aggregator's hub serves everyone, passive parties only dial out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..network.agreement import Agreement
from ..network.handshake import Cast, Request
from ..network.network import Plan
from ..secure import identity
from ..transport.protocols import Protocol
from .role import RoleSpec

AGGREGATOR = "aggregator"
LOOPBACK = "127.0.0.1:0"  # a local world's hubs listen on loopback; the ports come in the address book


def plan_for(name: str, cast: Cast, addresses: Mapping[str, str]) -> Plan:
    """Star links: the active party's hub accepts the other parties, the aggregator's hub accepts every
    party, a passive party dials the active party (which relays to the other parties) and the aggregator."""
    aggregator, others = cast.aggregator, tuple(p for p in cast.parties if p != cast.active)
    if name == aggregator:
        return Plan(serve_at=addresses[aggregator], accept=cast.parties)
    dial = ((aggregator, addresses.get(aggregator, "")),) if aggregator else ()
    if name == cast.active:
        return Plan(serve_at=addresses[cast.active], accept=others, dial=dial)
    return Plan(dial=((cast.active, addresses.get(cast.active, "")), *dial), relay=cast.active)


def make_identities(names: Sequence[str], folder: Path) -> dict[str, bytes]:
    """A fresh identity per role, each private key in `folder/<name>.key` (owner-only); the pins."""
    pins = {}
    for name in names:
        key = identity.generate()
        path = Path(folder) / f"{name}.key"
        path.unlink(missing_ok=True)  # a local world's keys are its own: a re-run makes new ones
        identity.write_private_key(path, key)
        pins[name] = identity.public_bytes(key)
    return pins


def base_agreement(protocol: Protocol, cast: Cast, consent: bool, settings: Mapping[str, object]) -> Agreement:
    """The fields every run agrees on (the protocol and each of its parameters, `protocol.NAME`), plus the
    run's own `settings` (model fingerprint, command, ...)."""
    aggregator = identity.pin_text(cast.pins[cast.aggregator]) if cast.aggregator else None
    parameters = {f"protocol.{name}": value for name, value in protocol.parameters().items()}
    return Agreement({"protocol": protocol.name, **parameters, "active": cast.active, "aggregator": aggregator,
                      "parties": [[p, identity.pin_text(cast.pins[p])] for p in cast.parties],
                      "allow_two_party_disclosure": bool(consent), **settings})


def local_specs(protocol: Protocol, parties: Sequence[str], active: str, key_dir: Path,
                settings: Mapping[str, object], consent: bool = False, record: bool = False,
                join_timeout_s: float = 120.0) -> list[RoleSpec]:
    """Every role of a run on this machine (the parties in rank order, then the helpers)."""
    aggregator = AGGREGATOR if protocol.helpers else None
    roles = [*parties, *([aggregator] if aggregator else [])]
    cast = Cast(tuple(parties), active, aggregator, make_identities(roles, key_dir))
    agreement = base_agreement(protocol, cast, consent, settings)
    request = Request(tuple(parties), True, join_timeout_s, "the simulation's settings")
    addresses = {active: LOOPBACK, **({aggregator: LOOPBACK} if aggregator else {})}
    return [RoleSpec(name, cast, protocol, agreement, request, plan_for(name, cast, addresses),
                     str(Path(key_dir) / f"{name}.key"), record) for name in roles]
