"""The protocols, registered in one place (one line each): what each protects, which processes it needs,
and how each process sets it up. The contract is `ciphers.base.Protocol`; each protocol lives with its
sum cipher in `ciphers/`. A plug-in outside the package registers its own with `register`.
"""

from __future__ import annotations

from ..errors import InputError
from .ciphers.base import Membership, Protocol, SumCipher
from .ciphers.he import He
from .ciphers.mpc import Mpc
from .ciphers.plain import Plain

__all__ = ["PROTOCOLS", "He", "Membership", "Mpc", "Plain", "Protocol", "SumCipher", "cipher_protecting",
           "protocol_named", "register"]

PROTOCOLS: dict[str, Protocol] = {}


def register(protocol: Protocol) -> Protocol:
    """Add a protocol to the registry under its name (a second one of the same name is refused)."""
    if protocol.name in PROTOCOLS and PROTOCOLS[protocol.name] != protocol:
        raise ValueError(f"a protocol named {protocol.name!r} is already registered")
    PROTOCOLS[protocol.name] = protocol
    return protocol


for _protocol in (Plain(), Mpc(), He()):
    register(_protocol)


def cipher_protecting(protection: str) -> type[SumCipher] | None:
    """The cipher class of the registered protocol whose sums travel under `protection` (the audits ask it)."""
    return next((p.cipher_class for p in PROTOCOLS.values() if p.protection == protection), None)


def protocol_named(name: str | Protocol) -> Protocol:
    """The registered protocol of that name (a `Protocol` is returned as it is)."""
    if isinstance(name, Protocol):
        return name
    if name not in PROTOCOLS:
        raise InputError(f"unknown protocol {name!r}; choose one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]
