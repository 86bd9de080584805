"""Who takes part in one run when every party runs on its own host (`--party NAME`).

Every role checks in at the rendezvous store (which the active party serves). The active party waits
up to `[federation] join_timeout_s` for the listed roles, then publishes the roster: the parties
present and the protocol. Training needs every listed party (and the he aggregator), so a missing one
ends the run naming it; a prediction goes ahead with the parties that joined: a listed party that is
away is left out, not waited for beyond the deadline. Party names and their presence are public to
the federation; nothing else is in the store.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from ..errors import InputError
from ..runtime.liveness import STARTUP_S
from ..transport.protocols import protocol_named
from .config import AGGREGATOR, Federation

_ROSTER = "roster"
_READ = "roster_read"  # how many roles have read the roster
_POLL_S = 0.2
_READ_GRACE_S = 5.0  # how long the active party keeps the store up for the others to read a refusal


@dataclass(frozen=True)
class Roster:
    present: list[str]  # the parties of this run, in the federation's order
    protocol: str  # "plain" when the active party is alone (nothing crosses a party boundary)


def agree(store: dist.TCPStore, fed: Federation, name: str, command: str, expected: list[str],
          protocol: str) -> Roster:
    """Check in as role `name` and return the run's roster (the active party decides it). `expected`
    are the listed parties not declared absent. An InputError says why a role cannot take part."""
    store.set(f"checkin/{name}", b"1")
    if name == fed.active:
        return _decide(store, fed, command, expected, protocol)
    return _read(store, fed, name)


def _decide(store: dist.TCPStore, fed: Federation, command: str, expected: list[str], protocol: str) -> Roster:
    waiting = [*expected, *(AGGREGATOR for _ in protocol_named(protocol).helpers)]
    joined = _joined(store, waiting, fed.join_timeout_s)
    missing = [role for role in waiting if role not in joined]
    try:
        if missing and (command == "train" or AGGREGATOR in missing):
            need = "training needs every listed party" if command == "train" else "the he aggregator must take part"
            raise InputError(f"{', '.join(missing)} did not join within {fed.join_timeout_s:g} s "
                             f"([federation] join_timeout_s in {fed.path}); {need}")
        present = [party for party in expected if party in joined]
        roster = Roster(present, admit(fed, len(present), protocol))
    except InputError as error:
        store.set(_ROSTER, json.dumps({"error": str(error)}))
        _await_readers(store, len(joined) - 1)
        raise
    if missing:
        print(f"left out (did not join within {fed.join_timeout_s:g} s): {', '.join(missing)}", file=sys.stderr)
    store.set(_ROSTER, json.dumps({"present": roster.present, "protocol": roster.protocol}))
    return roster


def _joined(store: dist.TCPStore, roles: list[str], timeout_s: float) -> set[str]:
    """The roles that checked in by the deadline (returns as soon as all of them have)."""
    deadline = time.monotonic() + timeout_s
    while True:
        joined = {role for role in roles if store.check([f"checkin/{role}"])}
        if len(joined) == len(roles) or time.monotonic() >= deadline:
            return joined
        time.sleep(_POLL_S)


def _await_readers(store: dist.TCPStore, readers: int) -> None:
    deadline = time.monotonic() + _READ_GRACE_S
    while int(store.add(_READ, 0)) < readers and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _read(store: dist.TCPStore, fed: Federation, name: str) -> Roster:
    try:
        store.wait([_ROSTER], timedelta(seconds=fed.join_timeout_s + STARTUP_S))
        record = json.loads(store.get(_ROSTER))
        store.add(_READ, 1)
    except (RuntimeError, dist.DistStoreError) as error:
        raise InputError(f"{name}: the active party {fed.active!r} published no roster at the rendezvous "
                         f"{fed.rendezvous[0]}:{fed.rendezvous[1]} ({str(error).splitlines()[0][:120]})") from None
    if "error" in record:
        raise InputError(f"the active party {fed.active!r} refused the run: {record['error']}")
    roster = Roster(list(record["present"]), record["protocol"])
    taking_part = bool(protocol_named(roster.protocol).helpers) if name == AGGREGATOR else name in roster.present
    if not taking_part:
        raise InputError(f"{name} is not in this run: the active party {fed.active!r} started without it (declared "
                         f"absent, or joined after join_timeout_s = {fed.join_timeout_s:g} s)")
    return roster


def admit(fed: Federation, parties: int, protocol: str) -> str:
    """The protocol `parties` present parties run: plain for one party alone (nothing crosses a party
    boundary); an InputError when the protocol refuses that many (two, without the file's consent)."""
    protocol = protocol if parties > 1 else "plain"
    protocol_named(protocol).check_parties(parties, fed.allow_two_party_disclosure,
                                           f"set allow_two_party_disclosure = true in [federation] of {fed.path}")
    return protocol
