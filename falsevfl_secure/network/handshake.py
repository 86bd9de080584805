"""The start of every run, before any data moves: who takes part, under which protocol, with which keys.

Set-up steps (`protocols/session.toml`), all over the authenticated links of `network.network`:

1. `hello` (every role -> the active party): a fresh 32-byte nonce and the role's agreement record
   (`network.agreement`, built from its OWN configuration), signed by its pinned identity.
2. `roster` (the active party -> every role that joined): the parties present, the protocol, and every
   present role's signed hello, signed by the active party. Each role checks every signature against its
   own pins, every agreement record against its own (a difference ends the run naming the field and the
   role, at every role, before anything else is sent), that its own fresh hello is in it (no replay), that
   the protocol is its own file's, and the two-party rule against its own consent. The session id is the
   hash of the present roles' names and nonces, so it is fresh if any one role is honest.
3. `keys` (every present party <-> the active party): an ephemeral X25519 public key, signed by its owner
   over the session id; the active party relays all of them to every party, which checks each signature
   (a relay that substitutes a key is caught here). Pair keys derive from them with a transcript that
   binds the session, the agreement and every key (`secure.masks`).
4. `context` (he only; the active party -> every passive party and the aggregator): the CKKS public
   context, signed by the active party over the session id.

A role that refuses raises `InputError` with one line; the active party first tells everyone linked why
(the reason names fields and roles, and a setting's values: settings the participants share anyway; never data).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import FalseVflError, InputError, ProtocolError
from ..secure.identity import PrivateKey, sign, verify
from .agreement import Agreement, is_setting, named_differences, shown
from .network import DEADLINE_MIN_S, RECV_TIMEOUT_S, Network
from .wire import peer_json

NONCE_BYTES = 32
REJOIN_WAIT_S = 7 * 24 * 3600.0  # a returning party waits for the next epoch's start at its own cost only
MAX_RECORD_BYTES = 1 << 20


# 'model' is a fingerprint of every [model] setting and the noise [privacy] states (what each file must say alike)
_NAMED_FIELDS = 8  # fields of a record a peer sent that ours lacks, named at most
_MODEL_HINT = (" (the fingerprint of the [model] settings and of [privacy]'s noise_multiplier, collusion and clip "
               "norms; each party's epsilon, delta and max_releases_per_row are its own)")


@dataclass(frozen=True)
class Cast:
    """The roles of a run as this role's own configuration names them; `pins`: role name -> public key."""

    parties: tuple[str, ...]
    active: str
    aggregator: str | None  # the he aggregator's role name, when the protocol has one
    pins: dict[str, bytes]


@dataclass(frozen=True)
class Request:
    """What this role was started to do: `expected` parties (not declared absent), whether training needs
    every listed party, how long the active party waits for the others, and the file the settings came from."""

    expected: tuple[str, ...]
    needs_all: bool
    join_timeout_s: float
    source: str = "the configuration"
    round_deadline_s: float = DEADLINE_MIN_S  # the least time a peer may heartbeat without delivering its frame
    rejoin: bool = False  # a party that left a run that went on, coming back (runtime/losses.py)


def roster_wait_s(request: Request) -> float:
    """How long a party waits for the roster: the join wait its own file allows the active party, then the set-up
    limit for the hellos and the roster themselves."""
    return request.join_timeout_s + RECV_TIMEOUT_S


@dataclass
class Session:
    """What the set-up settled: the session id, the present parties in rank order, the protocol, and each
    present party's verified X25519 public key (with the transcript the pair keys bind to)."""

    id: bytes
    agreement: Agreement
    present: tuple[str, ...]
    protocol: str
    active: str
    aggregator: str | None
    x25519: dict[str, bytes] = field(default_factory=dict)
    transcript: bytes = b""
    left_out: tuple[str, ...] = ()  # at the active party: listed parties that did not join in time
    roster: bytes = b""  # at the active party: the signed roster it sent (a returning party checks it)
    key_records: dict[str, dict] = field(default_factory=dict)  # each party's signed key: {"version", "record"}

    @property
    def active_index(self) -> int:
        return self.present.index(self.active)

    def rank(self, name: str) -> int:
        return self.present.index(name)

    def bind_keys(self) -> None:
        """The transcript every pair key binds to: the session, the agreement and every party's current key."""
        self.transcript = hashlib.sha256(b"falsevfl/keys/v1\0" + self.id + self.agreement.digest()
                                         + b"".join(self.x25519[p] for p in self.present)).digest()


def key_context(session_id: bytes, version: int) -> bytes:
    """What a party's X25519 key is signed over: the session, and for a key made to rejoin, the membership
    version it rejoins at (so a key is never taken for another return)."""
    if version == 0:
        return session_id
    return hashlib.sha256(b"falsevfl/rejoin/v1\0" + session_id + version.to_bytes(8, "big")).digest()


def _dumps(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def _record(payload: bytes, sender: str) -> object:
    """A party's key record as JSON (its form is checked with its signature, `check_key`)."""
    try:
        return peer_json(payload)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"set-up step 'keys': the record from {sender} is not JSON") from None


def _loads(payload: bytes, sender: str, step: str, keys: set[str]) -> dict:
    """A received set-up record: JSON with exactly `keys` (never anything executable)."""
    try:
        record = peer_json(payload) if len(payload) <= MAX_RECORD_BYTES else None
    except ValueError:  # (also int() of a number of more than 4300 digits, not a JSONDecodeError: review finding)
        record = None
    if not isinstance(record, dict) or set(record) != keys:
        raise ProtocolError(f"set-up step {step!r}: the record from {sender} is not of the declared form")
    return record


def _hex(record: dict, key: str, size: int | None, sender: str) -> bytes:
    try:
        value = bytes.fromhex(record[key])
    except (TypeError, ValueError):
        value = None
    if value is None or (size is not None and len(value) != size):
        raise ProtocolError(f"the {key} from {sender} is not {size or 'some'} bytes of hex")
    return value


# -- the set-up of one role -----------------------------------------------------------------------------


def _hello(name: str, key: PrivateKey, agreement: Agreement) -> dict:
    nonce = secrets.token_bytes(NONCE_BYTES)
    signature = sign(key, "hello", name.encode() + b"\0" + nonce + agreement.digest())
    return {"name": name, "nonce": nonce.hex(), "agreement": dict(agreement.fields), "signature": signature.hex()}


def session_id(hellos: list[dict]) -> bytes:
    digest = hashlib.sha256(b"falsevfl/session/v1\0")
    for hello in hellos:
        digest.update(hello["name"].encode() + b"\0" + bytes.fromhex(hello["nonce"]))
    return digest.digest()


def check_two_parties(n_present: int, agreement: Agreement, source: str, hides: bool) -> None:
    """Two parties under a protocol that hides contributions (`hides`, the policy of the protocol this
    role's own file names): only with consent in this role's own file."""
    if n_present == 2 and hides and not agreement.get("allow_two_party_disclosure"):
        raise InputError(f"only two parties take part: under {agreement.get('protocol')} the sum minus the active "
                         "party's own contribution is the other party's, so it hides nothing. Use 3 or more "
                         f"parties, or set allow_two_party_disclosure = true in [federation] of {source}")


def check_min_parties(n_present: int, agreement: Agreement, source: str) -> None:
    """`min_parties` holds for every run, a prediction with parties absent included, not only after a loss (red
    team: a file saying 4 took part in a prediction of 3 started with --absent, but refused a loss leaving 3)."""
    floor = int(agreement.fields.get("min_parties", 2))  # (a test session's agreement has no policy: 2)
    if 1 < n_present < floor:  # (the active party alone involves no other party: it predicts from its own rows)
        raise InputError(f"only {n_present} parties take part, fewer than min_parties = {floor} in [federation] of "
                         f"{source}: no run goes on with fewer")


class Handshake:
    """One role's side of the set-up (steps 1 to 3 above). Each check is a method of its own, so that a test
    can build a deliberately weakened or malicious role by overriding one step; the shipped build runs them all."""

    def __init__(self, net: Network, me: str, key: PrivateKey, agreement: Agreement, cast: Cast,
                 request: Request, hides_contributions: bool = True) -> None:
        self.net, self.me, self.key, self.agreement, self.cast, self.request = net, me, key, agreement, cast, request
        self.hides = hides_contributions  # the two-party rule's policy: the protocol's, passed in

    def run(self, key_agreement: Callable[[], object]) -> tuple[Session, object | None]:
        """The session, and this party's X25519 agreement object (None for a helper or a party alone)."""
        session = self.lead() if self.me == self.cast.active else self.follow()
        exchange = key_agreement() if self.me in session.present and len(session.present) > 1 else None
        if exchange is not None:
            self.exchange_keys(session, exchange)
        return session, exchange

    # -- hello and roster -----------------------------------------------------------------------------

    def check_hello(self, hello: dict) -> Agreement:
        """The agreement in a signed hello, verified against the sender's pin and compared with ours."""
        name = hello.get("name") if isinstance(hello, dict) else None
        if name not in self.cast.pins:
            raise ProtocolError(f"a hello names {name!r}, which is not a pinned participant")
        record = _loads(_dumps(hello), name, "hello", {"name", "nonce", "agreement", "signature"})
        theirs = Agreement.from_json(record["agreement"], name)
        nonce, signature = _hex(record, "nonce", NONCE_BYTES, name), _hex(record, "signature", 64, name)
        verify(self.cast.pins[name], "hello", name.encode() + b"\0" + nonce + theirs.digest(), signature, name)
        differ = self.agreement.differences(theirs)
        if differ:
            raise InputError(f"the configurations of {name} and {self.me} differ in {self._named(differ, theirs, name)}"
                             ": every participant must agree on them; the run stops before any data is sent")
        return theirs

    def _named(self, differ: list[str], theirs: Agreement, name: str) -> str:
        """The differing fields; the settings as the file writes them, with both values (the settings all share
        anyway), in place of the model's fingerprint (which named no setting: a clip norm changed in one file)."""
        settings = named_differences(self.agreement, theirs, self.me, name)
        fields = [shown(f) for f in differ if not (settings and is_setting(f)) and (f != "model" or settings is None)]
        hint = _MODEL_HINT if "model" in differ and settings is None else ""
        return ", ".join([*fields[:_NAMED_FIELDS], *([settings] if settings else [])]) + hint

    def lead(self) -> Session:
        """The active party: collect the hellos, decide the roster, tell everyone (or tell them why not)."""
        cast, request, net = self.cast, self.request, self.net
        if isinstance(net, Network):  # the relay every passive party's plan names (a test's stand-in relays nothing)
            net.relay_for(p for p in cast.parties if p != self.me)
        others = [p for p in request.expected if p != self.me] + ([cast.aggregator] if cast.aggregator else [])
        linked = net.wait_for(others, time.monotonic() + request.join_timeout_s)
        hellos = {self.me: _hello(self.me, self.key, self.agreement)}
        try:
            for role in [r for r in others if r in linked]:
                hellos[role] = peer_json(net.recv(role, "hello"))
                if not isinstance(hellos[role], dict) or hellos[role].get("name") != role:
                    raise ProtocolError(f"the hello that came from {role} names another role")
                self.check_hello(hellos[role])
            present = self.decide(linked, others)
        except (FalseVflError, ValueError) as error:  # (malformed JSON, or bytes that are no text at all)
            self.announce(sorted(linked), {"refused": str(error)})
            raise InputError(str(error)) from None
        roles = [*present, *([cast.aggregator] if cast.aggregator else [])]
        protocol = str(self.agreement.get("protocol")) if len(present) > 1 else "plain"
        roster = {"present": list(present), "protocol": protocol, "hellos": [hellos[r] for r in roles]}
        signed = self.announce(sorted(linked), roster)
        net.dismiss(r for r in linked if r not in roles)  # told they are not in this run, they leave
        left_out = tuple(p for p in request.expected if p not in present)
        return Session(session_id(roster["hellos"]), self.agreement, tuple(present), protocol, self.me,
                       cast.aggregator, left_out=left_out, roster=signed)

    def decide(self, linked: set[str], others: list[str]) -> list[str]:
        """The present parties (in the listed order), or an `InputError` saying why the run cannot start."""
        cast, request = self.cast, self.request
        missing = [r for r in others if r not in linked]
        if missing and (request.needs_all or cast.aggregator in missing):
            need = "training needs every listed party" if request.needs_all else "the he aggregator must take part"
            raise InputError(f"{', '.join(missing)} did not join within {request.join_timeout_s:g} s "
                             f"(join_timeout_s in {request.source}); {need}")
        present = [p for p in cast.parties if p == cast.active or p in linked]
        try:
            check_two_parties(len(present), self.agreement, request.source, self.hides)
        except InputError:
            if not missing:
                raise
            raise InputError(f"{', '.join(missing)} did not join within {request.join_timeout_s:g} s (join_timeout_s "
                             f"in {request.source}); without {'it' if len(missing) == 1 else 'them'} only two parties "
                             "would take part, which hide nothing from each other. A party that cannot connect says "
                             "why on its own host (a pin that does not match, its key file, an address)") from None
        check_min_parties(len(present), self.agreement, request.source)
        return present

    def announce(self, roles: list[str], record: dict, step: str = "roster") -> bytes:
        """The active party's signed roster (or refusal, or answer to a returning party) to `roles`."""
        body = _dumps(record)
        payload = _dumps({step: body.decode(), "signature": sign(self.key, step, body).hex()})
        for role in roles:
            self.net.send(role, step, payload)
        return payload

    def say_hello(self) -> dict:
        """Once linked to the active party, this role's fresh signed hello to it (the hello sent)."""
        cast = self.cast
        if not self.net.wait_for([cast.active], time.monotonic() + self.request.join_timeout_s):
            raise InputError(f"the active party {cast.active} did not connect within "
                             f"{self.request.join_timeout_s:g} s")
        mine = _hello(self.me, self.key, self.agreement)
        self.net.send(cast.active, "hello", _dumps(mine))
        return mine

    def follow(self) -> Session:
        """Every other role: send the hello, then check everything in the active party's roster itself."""
        cast, net = self.cast, self.net
        mine = self.say_hello()
        # the active party may wait join_timeout_s for the others first (this file's bound; review: a longer
        # join_timeout_s than the set-up limit had a party that joined early fail alone before the roster came)
        roster = self.read_signed(net.recv(cast.active, "roster", roster_wait_s(self.request)), "roster",
                                  {"present", "protocol", "hellos"})
        present = self.check_roster(roster, mine)
        return Session(session_id(roster["hellos"]), self.agreement, present, roster["protocol"], cast.active,
                       cast.aggregator)

    def read_signed(self, payload: bytes, step: str, keys: set[str]) -> dict:
        """A record the active party signed (`roster`, `rejoin`), verified against its pin; its refusal raised."""
        active = self.cast.active
        outer = _loads(payload, active, step, {step, "signature"})
        body = str(outer[step]).encode()
        verify(self.cast.pins[active], step, body, _hex(outer, "signature", 64, active), active)
        try:
            record = peer_json(body)
        except ValueError:  # (a JSONDecodeError, or a number of more than 4300 digits: review finding)
            raise ProtocolError(f"set-up step {step!r}: the record from {active} is not of the declared form") from None
        if isinstance(record, dict) and "refused" in record:
            raise InputError(f"the active party {active} refused {'the run' if step == 'roster' else 'its return'}: "
                             f"{record['refused']}")
        return _loads(body, active, step, keys)

    def check_roster(self, roster: dict, mine: dict | None) -> tuple[str, ...]:
        """Every hello in the roster verified and compared with our own file; the protocol, the two-party
        rule and the training rule checked against our own file; our own fresh hello in it."""
        cast, request, me = self.cast, self.request, self.me
        present = roster["present"]
        if not isinstance(present, list) or not set(present) <= set(cast.parties) or cast.active not in present:
            raise ProtocolError(f"the roster of {cast.active} names parties that are not the listed ones")
        roles = [*present, *([cast.aggregator] if cast.aggregator else [])]
        hellos = roster["hellos"]
        if not isinstance(hellos, list) or [h.get("name") if isinstance(h, dict) else None for h in hellos] != roles:
            raise ProtocolError(f"the roster of {cast.active} does not carry one hello per present role")
        for hello in hellos:
            self.check_hello(hello)
        if me != cast.aggregator and me not in present:
            raise InputError(f"{me} is not in this run: the active party {cast.active} started without it (declared "
                             f"absent, or joined after join_timeout_s = {request.join_timeout_s:g} s)")
        if mine is not None and mine not in hellos:  # (None: a returning party, whose answer echoes its nonce)
            raise ProtocolError(f"the roster of {cast.active} does not carry this role's fresh hello (a replay?)")
        if roster["protocol"] != self.agreement.get("protocol") and len(present) > 1:
            raise InputError(f"the active party announced protocol {roster['protocol']!r}, but {request.source} "
                             f"says {self.agreement.get('protocol')!r}: this party never sends under weaker protection")
        if request.needs_all and set(present) != set(cast.parties):
            raise InputError(f"training needs every listed party; the roster of {cast.active} leaves out "
                             f"{', '.join(sorted(set(cast.parties) - set(present)))}")
        check_two_parties(len(present), self.agreement, request.source, self.hides)
        check_min_parties(len(present), self.agreement, request.source)
        return tuple(present)

    # -- signed ephemeral keys ------------------------------------------------------------------------

    def key_message(self, session: bytes, public: bytes) -> dict:
        signature = sign(self.key, "x25519", session + self.me.encode() + b"\0" + public)
        return {"name": self.me, "x25519": public.hex(), "signature": signature.hex()}

    def check_key(self, record: dict, session: bytes) -> bytes:
        """A party's X25519 key, verified against its pin and bound to this session."""
        name = record.get("name") if isinstance(record, dict) else None
        if name not in self.cast.pins:
            raise ProtocolError(f"a key record names {name!r}, which is not a pinned participant")
        record = _loads(_dumps(record), name, "keys", {"name", "x25519", "signature"})
        public = _hex(record, "x25519", 32, name)
        verify(self.cast.pins[name], "x25519", session + name.encode() + b"\0" + public,
               _hex(record, "signature", 64, name), name)
        return public

    def exchange_keys(self, session: Session, exchange) -> None:
        """Every present party's signed X25519 key, verified by every party (relayed by the active party)."""
        listed = self.gather_keys(session, self.key_message(session.id, exchange.public_key()))
        publics = {p: self.check_key(r, session.id) for p, r in zip(session.present, listed, strict=True)}
        if [r.get("name") for r in listed] != list(session.present) or publics[self.me] != exchange.public_key():
            raise ProtocolError(f"the key bundle of {session.active} is not the present parties' keys in rank order")
        session.x25519 = publics
        session.key_records = {p: {"version": 0, "record": r} for p, r in zip(session.present, listed, strict=True)}
        session.bind_keys()

    def gather_keys(self, session: Session, own: dict) -> list[dict]:
        """The key records of the present parties in rank order: the active party collects and relays them."""
        net = self.net
        if self.me != session.active:
            net.send(session.active, "keys", _dumps(own))
            listed = _loads(net.recv(session.active, "keys"), session.active, "keys", {"keys"})["keys"]
            if not isinstance(listed, list) or len(listed) != len(session.present):
                raise ProtocolError(f"the key bundle of {session.active} does not hold one key per present party")
            return listed
        records = {self.me: own} | {p: _record(net.recv(p, "keys"), p) for p in session.present if p != self.me}
        bundle = _dumps({"keys": [records[p] for p in session.present]})
        for party in session.present:
            if party != self.me:
                net.send(party, "keys", bundle)
        return [records[p] for p in session.present]


    # -- a lost party's return (runtime/losses.py) -----------------------------------------------------

    def rejoin(self, key_agreement: Callable[[], object]) -> tuple[Session, object, dict]:
        """A party that left a run that went on: a fresh hello to the active party, whose signed answer echoes
        its nonce and carries the run's roster (as signed at the start), every party's current signed key and
        where to rejoin. Everything is checked against this party's own file and pins, as at the start; then
        it sends a fresh X25519 key, signed over the membership version it rejoins at."""
        cast, net = self.cast, self.net
        mine = self.say_hello()
        answer = self.read_signed(net.recv(cast.active, "rejoin", REJOIN_WAIT_S), "rejoin",
                                  {"roster", "keys", "nonce", "version", "lost", "stage", "epoch", "chain", "plan"})
        if answer["nonce"] != mine["nonce"]:
            raise ProtocolError(f"the answer of {cast.active} is not to this party's fresh hello (a replay?)")
        roster = self.read_signed(str(answer["roster"]).encode(), "roster", {"present", "protocol", "hellos"})
        present = self.check_roster(roster, None)
        session = Session(session_id(roster["hellos"]), self.agreement, present, roster["protocol"], cast.active,
                          cast.aggregator)
        keys, version = answer["keys"], answer["version"]
        if not isinstance(keys, list) or [_named(k) for k in keys] != list(present):
            raise ProtocolError(f"the key bundle of {cast.active} is not the present parties' keys in rank order")
        for entry in keys:
            self.accept_key(session, entry)
        numbers, lost = (version, answer["stage"], answer["epoch"], answer["plan"]), answer["lost"]
        if any(type(n) is not int or n < 0 for n in numbers) or version < 1 or answer["stage"] not in (1, 2) or \
                not isinstance(lost, list) or not all(n in present and n not in (self.me, cast.active) for n in lost) \
                or not _is_chain(answer["chain"]):
            raise ProtocolError(f"the answer of {cast.active} is not of the declared form")
        exchange = key_agreement()
        own = self.key_message(key_context(session.id, version), exchange.public_key())
        net.send(cast.active, "keys", _dumps(own))
        self.accept_key(session, {"version": version, "record": own})
        where = {k: answer[k] for k in ("version", "lost", "stage", "epoch", "chain", "plan")}
        return session, exchange, where

    def accept_key(self, session: Session, entry: dict) -> None:
        """A party's signed key for the membership version it names (0: the start), into the session."""
        if not isinstance(entry, dict) or set(entry) != {"version", "record"} or type(entry["version"]) is not int \
                or entry["version"] < 0:
            raise ProtocolError("a key entry is not of the declared form")
        name = entry["record"].get("name") if isinstance(entry["record"], dict) else None
        public = self.check_key(entry["record"], key_context(session.id, entry["version"]))
        if name not in session.present:
            raise ProtocolError(f"a key entry names {name!r}, which is not a present party")
        session.x25519[name], session.key_records[name] = public, entry
        if len(session.x25519) == len(session.present):
            session.bind_keys()

    def admit(self, session: Session, name: str, version: int, where: dict, limit_s: float) -> dict:
        """At the active party: answer a returning party's hello (checked as at the start), check its fresh
        key for `version`; the key entry every other party gets (`accept_key` once the party is readmitted). A
        refusal is told to it, signed, and raised."""
        try:
            hello = peer_json(self.net.recv(name, "hello", limit_s))
            if not isinstance(hello, dict) or hello.get("name") != name:
                raise ProtocolError(f"the hello that came from {name} names another role")
            self.check_hello(hello)
        except (FalseVflError, ValueError) as error:  # (JSONDecodeError is a ValueError)
            self.announce([name], {"refused": str(error)[:500]}, "rejoin")
            raise ProtocolError(f"the hello of {name}: {str(error)[:200]}") from None
        keys = [session.key_records[p] for p in session.present]
        self.announce([name], {"roster": session.roster.decode(), "keys": keys, "nonce": hello["nonce"],
                               "version": version, **where}, "rejoin")
        try:
            entry = {"version": version, "record": peer_json(self.net.recv(name, "keys", limit_s))}
        except ValueError:
            raise ProtocolError(f"the key record of {name} is not JSON of the declared form") from None
        self.check_key(entry["record"], key_context(session.id, version))  # into the session once it is in
        return entry


def _is_chain(value: object) -> bool:
    """The digest of what the parties were told before a readmission (runtime/losses.py): none yet, or 64 hex."""
    return value == "" or (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value))


def _named(entry: object) -> str | None:
    """The party a key entry names (None: not of the declared form)."""
    record = entry.get("record") if isinstance(entry, dict) else None
    return record.get("name") if isinstance(record, dict) else None


def pair_keys(session: Session, me: str, exchange, purpose: str) -> dict[int, bytes]:
    """This party's key with every other present party (by rank) for `purpose`."""
    publics = [session.x25519[p] for p in session.present]
    return exchange.pair_keys(session.rank(me), publics, session.transcript, purpose)


# -- step 4: the signed CKKS public context ------------------------------------------------------------


def send_context(net: Network, key: PrivateKey, session: Session, public: bytes, roles: list[str] | None = None
                 ) -> None:
    """To every other role (or to `roles`: a party that rejoined)."""
    signature = sign(key, "ckks context", session.id + hashlib.sha256(public).digest())
    for role in roles or [*(p for p in session.present if p != session.active), session.aggregator]:
        net.send(role, "context", signature + public)


def receive_context(net: Network, session: Session, cast: Cast) -> bytes:
    payload = net.recv(session.active, "context")
    signature, public = payload[:64], payload[64:]
    verify(cast.pins[session.active], "ckks context", session.id + hashlib.sha256(public).digest(), signature,
           session.active)
    return public
