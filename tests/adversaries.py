"""Test-only participants that break the rules: a malicious active party and deliberately weakened passive
parties, built by overriding one step of the shipped `Role` / `Handshake`. The shipped build never uses them;
tests/test_adversaries.py runs each against the shipped build, where its attack must fail, and against a
weakened build, where it must succeed. They live in a module of their own so that role processes can import
them by name."""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from falsevfl_secure.network.handshake import Handshake, _dumps, _loads
from falsevfl_secure.randomness import KeyStream
from falsevfl_secure.runtime.role import Role
from falsevfl_secure.secure.fixed_point import decode_fixed_point
from falsevfl_secure.secure.masks import X25519Agreement, derive_pair_key, zero_share
from falsevfl_secure.secure.mpc_sum import secure_sum
from falsevfl_secure.transport.rounds import POSTERIOR
from falsevfl_secure.transport.views import save_view

SHAPE = (4, 6)


def hold(role, seconds: float) -> None:
    """A misbehaving party's pause: `seconds`, or until the run is aborted (once it is named, a test need not sit
    out the rest of its story)."""
    deadline = time.monotonic() + seconds
    while role.network.aborted is None and time.monotonic() < deadline:
        time.sleep(0.1)


def party_input(rank: int) -> torch.Tensor:
    """A party's known input (the attack tests compare what the adversary recovers with it)."""
    return (torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float32).reshape(SHAPE) - 11.0) * (0.37 + rank)


# -- a malicious active party -------------------------------------------------------------------------


class DowngradingHandshake(Handshake):
    """An active party whose hello agrees with every file (it says mpc) but whose roster announces plain."""

    def announce(self, roles, record):
        super().announce(roles, {**record, "protocol": "plain"} if "protocol" in record else record)

    def lead(self):
        session = super().lead()
        session.protocol = "plain"
        return session


class DroppingHandshake(Handshake):
    """An active party that leaves out every party but the first from the roster: two parties under mpc."""

    def decide(self, linked, others):
        return [self.cast.parties[0], self.cast.active]


class SubstitutingHandshake(Handshake):
    """An active party that relays the key bundle with every other passive party's X25519 key replaced by
    one of its own (a man in the middle), and remembers what it told each party."""

    def gather_keys(self, session, own):
        records = {self.me: own} | {p: json.loads(self.net.recv(p, "keys")) for p in session.present if p != self.me}
        self.fakes, self.told = {}, {}
        for party in session.present:
            if party == self.me:
                continue
            told = {}
            for other in session.present:
                record = dict(records[other])
                if other not in (party, self.me):
                    fake = X25519PrivateKey.generate()
                    self.fakes[(party, other)] = fake
                    record["x25519"] = fake.public_key().public_bytes_raw().hex()  # its signature now lies
                told[other] = record
            self.told[party] = told
            self.net.send(party, "keys", _dumps({"keys": [told[p] for p in session.present]}))
        return [records[p] for p in session.present]

    def exchange_keys(self, session, exchange):
        self.exchange = exchange
        super().exchange_keys(session, exchange)


# -- deliberately weakened passive parties -----------------------------------------------------------


class ObedientHandshake(Handshake):
    """A passive party that takes the protocol and the parties from the active party's roster."""

    def check_roster(self, roster, mine):
        return tuple(roster["present"])


class TrustingHandshake(Handshake):
    """A passive party that takes the relayed X25519 keys without checking their owners' signatures."""

    def check_key(self, record, session):
        return bytes.fromhex(_loads(_dumps(record), "?", "keys", {"name", "x25519", "signature"})["x25519"])


class DowngradingActive(Role):
    handshake_class = DowngradingHandshake

    def leave(self, clean):
        if getattr(self, "view_path", None):
            save_view(self.view_path, self.view)  # what it received, even when the run failed
        super().leave(clean)


class DroppingActive(DowngradingActive):
    handshake_class = DroppingHandshake


class SubstitutingActive(Role):
    handshake_class = SubstitutingHandshake


class ObedientParty(Role):
    handshake_class = ObedientHandshake


class TrustingParty(Role):
    handshake_class = TrustingHandshake


# -- the programs -------------------------------------------------------------------------------------


def contribute(role, view_path: str | None = None) -> dict:
    """Every party sends its known input to the active party's sum (one posterior round, as in training)."""
    role.view_path = view_path
    value = party_input(role.rank)
    role.backend.declare({POSTERIOR.name: value.numel()})  # a helper's bound on the sum (he)
    total = role.backend.sum_to_active(POSTERIOR, value)
    received = [e.value for e in (role.view or []) if e.kind == "received" and e.round == POSTERIOR.name]
    return {"sum": None if total is None else total.numpy(), "received": received, "input": value.numpy()}


def unmask_with_substituted_keys(role) -> dict:
    """The man in the middle: one secure sum, then every passive party's share unmasked with the pair keys
    that party derived from the keys the relay told it."""
    from falsevfl_secure.secure.errors import SecureMessageError

    value = party_input(role.rank)
    shares: list = []
    try:
        secure_sum(value, role.peers.active_index, role.backend.cipher.shares, role.peers, view=shares)
    except SecureMessageError:
        pass  # the masks no longer cancel: the man in the middle does not need the sum, it has every input
    if not role.is_active:
        return {}
    handshake, session = role.handshake, role.session
    recovered = {}
    for share in shares:
        name = role.peers.names[share.src]
        told = handshake.told[name]
        publics = [bytes.fromhex(told[p]["x25519"]) for p in session.present]
        transcript = hashlib.sha256(b"falsevfl/keys/v1\0" + session.id + session.agreement.digest()
                                    + b"".join(publics)).digest()
        keys = {}
        for j, other in enumerate(session.present):
            if other == name:
                continue
            mine = handshake.exchange._private if other == role.spec.name else handshake.fakes[(name, other)]
            shared = mine.exchange(X25519PublicKey.from_public_bytes(publics[share.src]))
            keys[j] = derive_pair_key(shared, transcript, share.src, j, "secure-sum")
        mask = zero_share(share.src, {j: KeyStream(k) for j, k in keys.items()}, share.raw.numel())
        recovered[share.src] = decode_fixed_point(share.raw - mask)[:-1].reshape(SHAPE).numpy()
    return {"recovered": {str(k): v for k, v in recovered.items()},
            "inputs": {str(k): party_input(k).numpy() for k in recovered}}


# -- pair keys from public data ------------------------------------------------------------------------


class PublicAgreement(X25519Agreement):
    """A deliberately broken key agreement: pair keys that follow from public data (the two ranks), as
    masks from a public seed would. Test-only; never registered."""

    def pair_keys(self, rank, public_keys, transcript=None, purpose="secure-sum"):
        super().pair_keys(rank, public_keys, transcript, purpose)  # the shipped checks still run
        return {peer: public_pair_key(rank, peer) for peer in range(len(public_keys)) if peer != rank}


def public_pair_key(a: int, b: int) -> bytes:
    low, high = sorted((a, b))
    return hashlib.sha256(f"falsevfl-weak-public:{low}:{high}".encode()).digest()


def one_sum(role) -> dict:
    """One secure sum of every party's known input; the active party reports the shares it received."""
    shares: list = []
    secure_sum(party_input(role.rank), role.peers.active_index, role.backend.cipher.shares, role.peers, view=shares)
    return {"shares": {str(s.src): s.raw.numpy() for s in shares}}


def unmask_from_public_data(share: np.ndarray, src: int, parties: int) -> np.ndarray:
    """What an attacker computes when pair keys follow from public data: the mask, and so the input."""
    keys = {j: KeyStream(public_pair_key(src, j)) for j in range(parties) if j != src}
    mask = zero_share(src, keys, share.size)
    return decode_fixed_point(torch.as_tensor(share) - mask)[:-1].reshape(SHAPE).numpy()


__all__ = ["DowngradingActive", "DroppingActive", "ObedientParty", "PublicAgreement", "SubstitutingActive",
           "TrustingParty", "contribute", "one_sum", "party_input", "unmask_from_public_data",
           "unmask_with_substituted_keys"]

