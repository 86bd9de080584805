"""The contract of a sum cipher, and of the protocol that sets one up.

A sum round runs in four steps whatever the cipher: every party `protect`s its contribution (puts it on
the cipher's grid and hides it: pairwise masks, encryption, or nothing) into one byte message and sends it
to the combiner; the combiner (the active party itself, or a helper role that holds no key) `combine`s the
messages into one; the active party `reveal`s the sum from that (adding its own contribution where the
combiner did not). One generic backend (`transport.sums.SumBackend`) and one generic helper loop
(`transport.sums.serve_combiner`) run these steps for every cipher; a cipher only says how.

A `Protocol` states how the processes of a run set its cipher up (`open`: key agreement, a signed public
key) and which roles it needs; the registry (`transport.protocols`) holds one instance of each. Nothing
outside a cipher's own module asks which protocol it runs: it asks the protocol or the cipher object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
from torch import Tensor

from ...errors import InputError
from ...network.handshake import Cast, Session, receive_context, send_context
from ...network.peers import Peers
from ...secure.errors import SecureRangeError
from ...secure.identity import PrivateKey
from ...secure.masks import X25519Agreement
from ..cross_process import Backend
from ..rounds import Round
from ..sums import SumBackend, serve_combiner
from ..views import View


class SumCipher:
    """How one protocol protects the contributions to a sum. Subclasses declare `protection` (the word the
    round table, the specs and the views use) and `combined_by` (None: the active party combines; else
    the helper role's name), and implement the four steps.

    Guarantees a cipher states: `range_under(protocol, k)` (the largest |value| one of k parties may add
    under that protocol's parameters; beyond it `protect` refuses: stated once, and asked both by the
    cipher's own `addend_range(k)`, under the protocol it was built for, and by `Protocol.addend_range`) and
    `reveal_error(k, magnitude)` (the largest error of a revealed sum against the exact sum of k inputs of
    at most that magnitude: float32 rounding for the clear cipher; the grid's rounding, k * 2^-(bits + 1),
    plus float64's for the grid ciphers). `tests/test_sum_ciphers.py` checks both for every registered
    cipher, under its default parameters and others."""

    protection: ClassVar[str]
    combined_by: ClassVar[str | None] = None
    protocol: Protocol | None = None  # the protocol (with its parameters) that built it; None: it takes none

    def protect(self, round: Round, value: Tensor, n_addends: int) -> tuple[bytes, SecureRangeError | None]:
        """This party's message for `round` (float32 `value`), and its refusal when the cipher cannot carry
        the value: the message is then one that says nothing of the values, so nobody is left waiting."""
        raise NotImplementedError

    def message_bytes(self, round: Round, numel: int) -> int | None:
        """The exact size of one party's message of `numel` values (None: it varies; `wire_bytes` bounds it)."""
        return None

    def wire_bytes(self, round: Round, numel: int) -> int:
        """The most bytes one message of a sum of `numel` values takes (the network refuses more)."""
        size = self.message_bytes(round, numel)
        if size is None:
            raise NotImplementedError
        return size

    def seen(self, message: bytes, shape: tuple[int, ...] | None) -> np.ndarray:
        """What a view records of a message received (the audits read it); `shape` is the sum's (None at a
        helper, which holds no model configuration)."""
        return np.frombuffer(message, dtype=np.uint8).copy()

    @staticmethod
    def derivable(seen: np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
        """What the receiver can compute from a message it recorded (`seen`), in the shape of a contribution
        (the audits check each candidate against every party's contribution). A ciphertext: nothing (what it
        decrypts to is in the revealed sum)."""
        return []

    def combine(self, round: Round, messages: Mapping[int, bytes], shape: tuple[int, ...]) -> bytes:
        """The combiner's one message from every party's (by rank, in rank order)."""
        raise NotImplementedError

    def reveal(self, round: Round, combined: bytes, shape: tuple[int, ...], own: Tensor | None) -> Tensor:
        """The active party's sum (float32, of `shape`); `own` is its contribution when the combiner did not
        add it (a helper combines the passive parties' messages only; finite: `sums.finite_own`)."""
        raise NotImplementedError

    def explain(self, round: Round, refusal: SecureRangeError, me: str, n_addends: int) -> str:
        """The error line of a party that refused its own input."""
        return f"round {round.name!r}: {me}: {refusal}"

    @staticmethod
    def range_under(protocol: Protocol | None, n_addends: int) -> float:
        return float("inf")

    def addend_range(self, n_addends: int) -> float:
        return self.range_under(self.protocol, n_addends)

    def reveal_error(self, n_addends: int, magnitude: float) -> float:
        return n_addends * n_addends * magnitude * 2.0**-24  # float32 sums in party order

    def rekey(self, pair_keys: dict[int, bytes], alive: Sequence[int]) -> None:
        """Keys among the parties still in the run (a party left); a cipher without pair keys has none."""

    def close(self) -> None:
        """Release the cipher's own resources (helper processes, key material)."""


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
    """A protocol of the aggregate rounds: its cipher and how the processes set it up. Broadcasts always
    travel in clear.

    Class attributes: `name`; `protection` (how a contribution to a sum travels: the cipher's);
    `cipher_class` (the audits ask it what a recorded message may reveal, and `addend_range` its range);
    `runtimes` (where it runs: the in-process `local` runtime hosts every party, so only a protocol whose
    cipher is clear can run there); `hides_contributions` (whether the active party sees only sums);
    `helpers` (extra roles after the K parties, ranks K, K + 1, ...). A secure protocol at K = 2 hides
    nothing from the active party (the sum minus its own contribution is the other party's), so it runs
    only when acknowledged.

    Its dataclass fields are its parameters (mpc's grid, CKKS's modulus): they travel with the job (the
    role's spec carries this object, the cipher it builds gets them) and every party's agreement holds them
    (`parameters`), so parties with other parameters are refused at the handshake. A field compared False
    is a test's hook, not a parameter."""

    name: ClassVar[str]
    protection: ClassVar[str]
    cipher_class: ClassVar[type[SumCipher]]
    runtimes: ClassVar[tuple[str, ...]] = ("distributed",)
    hides_contributions: ClassVar[bool] = True
    helpers: ClassVar[tuple[str, ...]] = ()

    def world_size(self, parties: int) -> int:
        return parties + len(self.helpers)

    def addend_range(self, parties: int) -> float:
        """The largest |value| one party may contribute to a sum of `parties` addends (the documented range):
        its cipher's statement, under this protocol's parameters."""
        return self.cipher_class.range_under(self, parties)

    def parameters(self) -> dict[str, object]:
        """Its parameters by name, as JSON values (what every party's agreement holds)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.compare}
        return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}

    def check_parties(self, parties: int, acknowledged: bool = False,
                      consent: str = "pass --allow-two-party-disclosure") -> None:
        """Refuse 2 parties for a protocol that hides contributions unless acknowledged; `consent` says how."""
        if self.hides_contributions and parties == 2 and not acknowledged:
            raise InputError(f"--protocol {self.name} with 2 parties hides nothing from the active party: the sum "
                             f"minus its own contribution is the other party's. Use 3 or more parties, or {consent} "
                             "to run it anyway")

    def key_agreement(self):
        """This party's side of the session's pairwise key agreement (an ephemeral X25519 key)."""
        return X25519Agreement()

    def cipher(self, membership: Membership) -> SumCipher:
        """Set up a party's side of the cipher (collective over the parties)."""
        raise NotImplementedError

    def in_process(self, parties: int, active: int = 0) -> tuple[list[SumCipher], SumCipher | None]:
        """Every party's cipher (by rank) and the helper's (None without one) in one process, with fresh keys
        from the OS: for tests and benchmarks of the cipher alone (a run sets each up in its own process)."""
        raise NotImplementedError

    def open(self, membership: Membership) -> Backend:
        """A party's backend: the generic one, over this protocol's cipher."""
        return SumBackend(membership.peers, self.cipher(membership), membership.view)

    def welcome(self, membership: Membership, cipher: SumCipher, name: str) -> None:
        """At the active party: what a party that rejoined needs of the cipher's set-up (nothing by default:
        pair keys are made anew by every party, runtime/losses.py)."""

    def helper_cipher(self, membership: Membership) -> SumCipher:
        """The cipher as a helper role holds it (no key that reveals anything)."""
        raise InputError(f"protocol {self.name} has no helper roles")

    def serve(self, membership: Membership) -> None:
        """Run a helper role to its end: the generic combiner loop over the helper's cipher."""
        m = membership
        serve_combiner(m.peers, self.helper_cipher(m), m.view, m.on_recorded, m.recorded_rounds)


@dataclass(frozen=True)
class ActiveKeyProtocol(Protocol):
    """A protocol whose sums run under a key pair of the active party's, added by a helper that holds the
    public key only (`he`, and the Paillier plug-in of `bench/`): the active party makes the pair and sends
    the public part, signed over the session, to every other role, which verifies it against the active
    party's pin (`network.handshake.send_context`). A subclass says how keys are made and read and how its
    cipher is built for each role ("active", "passive" or "helper")."""

    helpers: ClassVar[tuple[str, ...]] = ("aggregator",)

    def make_keys(self) -> tuple[bytes, object]:
        """(the public key's bytes, the secret), from the operating system's entropy."""
        raise NotImplementedError

    def load_public(self, data: bytes) -> object:
        """The public key from its bytes, checked (a weak or malformed key is refused)."""
        raise NotImplementedError

    def build(self, public: object, secret: object | None, me: str, role: str) -> SumCipher:
        raise NotImplementedError

    def cipher(self, m: Membership) -> SumCipher:
        me = m.peers.names[m.rank]
        if m.rank != m.active_index:
            return self.build(self.load_public(receive_context(m.peers.network, m.session, m.cast)), None, me,
                              "passive")
        public, secret = self.make_keys()
        send_context(m.peers.network, m.key, m.session, public)
        cipher = self.build(self.load_public(public), secret, me, "active")
        cipher.published = public  # what a party that rejoins gets (`welcome`)
        return cipher

    def welcome(self, m: Membership, cipher: SumCipher, name: str) -> None:
        send_context(m.peers.network, m.key, m.session, cipher.published, [name])

    def helper_cipher(self, m: Membership) -> SumCipher:
        public = self.load_public(receive_context(m.peers.network, m.session, m.cast))
        return self.build(public, None, m.peers.names[m.rank], "helper")
