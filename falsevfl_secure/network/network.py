"""One role's view of the federation's links: who it can reach, what arrived from whom, who is alive.

A `Network` owns the role's links (`network.link`): the hub it serves, if any, and the hubs it dials.
`send(dst, tag, payload)` goes over the direct link to `dst`, or through the relay hub (the active party)
when there is none; only the relay's hub forwards (between the roles it relays for, `relay_for`), and only
after checking that its sender is the authenticated peer of the stream it came on, so nobody can speak for
another role. `recv(src, tag)` returns the next frame from `src` (frames from one sender arrive in order) and
refuses one with another tag.

Bounds. A peer cannot take more than its round: a role accepts only the tags it declared (the set-up steps
of `SETUP`, then the rounds the transport `allow`s with each frame's largest size, computed from the round
table, the batch and the protocol), each only from the roles that may send it to this role (`ROUTES`), and
refuses a frame as soon as it grows past its tag's bound (before it is whole): the offender is named and the
run ends. A sender ahead of the rounds is held back instead (gRPC flow control: its frames wait in its own
memory) while `depth` of its frames of one tag wait unread here, and the hub holds a relayed sender back while
the receiver's queue is full, as `send` holds this role while a peer's is. So no peer grows another's memory
by more than its declared frames, and one that reads nothing is named.

Liveness. Both ends of every link send a heartbeat each `HEARTBEAT_S` naming the round they are in, how many
rounds they have entered, whether they are waiting on someone and how many units of their own work between passes
they have done (a wait past `RECV_TIMEOUT_S` counts those, within its own schedule's allowance; past it a linked
peer is named, in set-up too, unless it says it waits on a role it may wait on (outside a round any role of the run,
in a round one the routes allow), which leaves this role failing alone). A peer
silent for `STALL_S` is stalled, a link that closes without a goodbye means its peer left, and a peer that heartbeats
but delivers nothing in a round for `deadline_s` (while not itself waiting on a role that may send it a round's frame;
its rising round count renews that for at most `ROUNDS_PER_WAIT` rounds) is stuck: each ends the run at
this role, which tells every peer it is linked to (`ABORT`, flooded onward once), so every role fails naming the
role and round. An ABORT carries only who, how and in which round: never a value, never another role's error text,
and it is believed only as its sender's word (`Blame.by`). `close()` is a goodbye barrier, so a role leaves only
when everybody is done with it. A lost party may link to a hub again (`returning`: what its earlier process left
here is dropped); only the active party readmits it, at an epoch's start (runtime/losses.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType

from ..errors import PartyFailure, ProtocolError
from ..secure.identity import PrivateKey, tls_material
from . import wire
from .link import Hub, Link, dial, secure_channel
from .wire import Refused

HEARTBEAT_S = 1.0
STALL_S = 10.0
# Set-up steps and waits on a peer that is itself waiting or working alone (deadlines cover the rounds): counted
# from the peer's last progress, so a peer that heartbeats and advances through its declared work is not stalled.
RECV_TIMEOUT_S = 900.0
CLOSE_TIMEOUT_S = 30.0
LINGER_S = 1.0  # what leaving waits, at most, for its last frames to go out
# A round's deadline: DEADLINE_FACTOR times the slowest round this role has measured, at least DEADLINE_MIN_S
# (the first rounds, before any measurement, get DEADLINE_MIN_S).
DEADLINE_MIN_S = 45.0
DEADLINE_FACTOR = 20.0
ROUNDS_PER_WAIT = 4  # rounds a peer's heartbeat may say it entered while this role waits on it, and count
ROUND_DEPTH = 2  # frames of one round a sender may have waiting: its current step's and the next step's
RELAY_QUEUE_BYTES = 8 << 20  # the hub holds a sender back while this much waits for the receiver
# The set-up steps a role accepts from the start: (largest frame in bytes, frames that may wait). The
# alignment's frames hold up to max_ids points (32 bytes each) per listing party and the announcement 24 bytes
# per kept record: 256 MiB covers the default max_ids of 10^6 at K <= 8.
SETUP: dict[str, tuple[int, int]] = {
    "hello": (64 << 10, 2), "roster": (1 << 20, 2), "keys": (1 << 20, 2), "context": (64 << 20, 2),
    "align": (256 << 20, 8), "kept": (256 << 20, 2), "resume": (4 << 10, 2), "barrier": (1 << 10, 2),
    "stop": (1 << 10, 2), "sum": (256 << 10, 8), "lost": (4 << 10, 4), "lost-ack": (64, 4),
    "rejoin": (4 << 20, 2), "epoch": (64 << 10, 2), "epoch-ack": (64, 2), "bounds": (64 << 10, 2),
    "bounds-ack": (64, 2), "pass-done": (1 << 10, 2), "model": (64, 2), "budget": (64 << 10, 2),
    "kept-ack": (64, 2), "resume-ack": (64, 2)}
# Set-up steps that are over once a method's rounds are declared (the public context, the alignment and its
# announcement, a bare secure sum): from then on a frame of theirs is refused, so that no peer can keep their
# 3 GiB of allowance waiting at this role for the rest of the run; one still waiting then is dropped, its sender named.
BEFORE_ROUNDS = ("context", "align", "kept", "kept-ack", "sum", "model", "budget")


def _routes(senders: str, receivers: str) -> frozenset[tuple[str, str]]:
    """(sender's place, receiver's place) for each place named in `senders` and in `receivers` (space-separated)."""
    return frozenset((s, r) for s in senders.split() for r in receivers.split())


# Who may send each step to whom, by place in the run: "active", "passive" (a party other than the active party)
# or "helper" (the he aggregator), as protocols/session.toml's [[steps]] say; "sum" and "barrier" are the test
# sessions' steps among the parties (a test's barrier reaches a helper too). A frame of a step from a place that
# may not send it to this role is refused, naming its sender (review finding: a helper or another passive party
# could park its allowance of every step at a passive party, which never reads them).
ROUTES: dict[str, frozenset[tuple[str, str]]] = {
    "hello": _routes("passive helper", "active"), "roster": _routes("active", "passive helper"),
    "keys": _routes("passive", "active") | _routes("active", "passive"), "context": _routes("active", "passive helper"),
    "align": _routes("active passive", "active passive"), "kept": _routes("active", "passive"),
    "kept-ack": _routes("passive", "active"), "resume-ack": _routes("active passive", "helper"),
    "resume": _routes("passive", "active") | _routes("active", "passive"),
    "barrier": _routes("active passive", "active passive helper"), "stop": _routes("passive", "helper"),
    "sum": _routes("active passive", "active passive"), "lost": _routes("active", "passive helper"),
    "lost-ack": _routes("passive helper", "active") | _routes("passive", "helper"),
    "rejoin": _routes("active", "passive"), "epoch": _routes("active", "passive helper"),
    "epoch-ack": _routes("helper", "active"), "bounds": _routes("active", "helper"),
    "bounds-ack": _routes("helper", "active"), "pass-done": _routes("active", "passive"),
    "model": _routes("passive", "active"), "budget": _routes("passive", "active") | _routes("active", "passive")}
# A round's frames (any tag not above): the active party's broadcasts, a party's contribution to the combiner (the
# active party or a helper), a helper's combined sum to the active party; never between passive parties.
ROUND_ROUTES = _routes("active", "passive") | _routes("passive", "active helper") | _routes("helper", "active")
# What the active party tells a helper between rounds (`Announced`): a readmission, the rounds' bounds; answered.
ANNOUNCEMENTS = ("epoch", "bounds")
ACKS = ("epoch-ack", "bounds-ack")
# A pass's first round may reach a role before its transport declared the method's rounds (a passive party
# starts its step while the active party still builds its model): until then, one frame of each, this large.
EARLY = ("posterior", "embedding", "subsets", "cross_view")
EARLY_BYTES = 32 << 20
# What a peer's heartbeat or abort may make this role print or forward: a blame's `how` is one of these, a round or
# a kind is at most TEXT_CHARS printable ASCII characters, a count at most COUNT_DIGITS digits (int() of a number
# of more than 4300 digits raised a ValueError that the link reader took for the peer leaving: review finding).
HOWS = ("stalled", "left", "stuck", "refused", "failed")
TEXT_CHARS = 64
COUNT_DIGITS = 18


@dataclass
class Wait:
    """One wait on a peer: when it began, each linked peer's link and units of work then, and the latest time
    a unit of work counted for it (`Network._counted_work`)."""

    began: float
    seen: dict[str, tuple[Link, int]]
    latest: float
    rounds: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # rounds entered: first, last, when

    @classmethod
    def of(cls, links: dict[str, Link]) -> Wait:
        now = time.monotonic()
        return cls(now, {peer: (link, link.work) for peer, link in list(links.items())}, now)

    def renewed(self, peer: str, link: Link, rounds_per_wait: int = ROUNDS_PER_WAIT) -> float:
        """When `peer` last entered a round this wait may count: at most ROUNDS_PER_WAIT of them (a peer cannot
        go further while this role, whose frames each round needs, waits on it; a red team's stalled party raised
        its count every second and was never named). Rounds entered are its count less its units of work."""
        rounds = link.progress - link.work
        start, last, at = self.rounds.setdefault(peer, (rounds, rounds, self.began))
        if last < rounds <= start + rounds_per_wait:
            self.rounds[peer] = (start, rounds, time.monotonic())
            return time.monotonic()
        return at

    def shown(self, peer: str, link: Link) -> int:
        """Units `peer` showed since the wait began (all of a link opened since: a party that linked again)."""
        then, work = self.seen.get(peer, (link, link.work))
        return link.work - (work if then is link else 0)


# What an error type a role announces means to the others (its text stays with its owner: it may quote values)
_KINDS = {"InputError": "InputError: its input, its own file or a party it expected; its host's output says which",
          "DataError": "DataError: its data; its host's output says what"}


@dataclass(frozen=True)
class Blame:
    """Why a run ended, as it may cross a party boundary: the role, how ("stalled", "left", "failed")
    and its last round; `kind` is the error type for "failed" (its text stays with its owner)."""

    role: str
    how: str
    round: str | None = None
    kind: str = ""
    by: str = ""  # who says so, when not this role itself: an ABORT is only its sender's word

    def text(self) -> str:
        where = where_in_run(self.round)
        what = {"stalled": f"stalled (no heartbeat for {STALL_S:.0f} s)",
                "left": f"left ({self.kind or 'its connection closed'})",
                "stuck": f"delivered nothing ({self.kind or 'past its deadline'}) while its heartbeat went on",
                "refused": f"was refused ({self.kind})",
                "failed": f"stopped with an error of its own ({_KINDS.get(self.kind, self.kind or 'see its output')})",
                }.get(self.how, self.how)
        said = f"{self.by} reports: " if self.by and self.by != self.role else ""
        return f"{said}{self.role} {what}{where}"


class RunAborted(PartyFailure):
    """The run ended because of another role (or this one's own failure was announced); `blame` says which."""

    def __init__(self, blame: Blame) -> None:
        super().__init__(blame.text())
        self.blame = blame


class PartyLost(PartyFailure):
    """A tolerated party left: at the active party `blame` says who and how (it decides and announces), at
    every other role `notice` is the active party's announcement (who, and the step every role resumes at)."""

    def __init__(self, blame: Blame | None = None, notice: dict | None = None) -> None:
        who = blame.text() if blame is not None else f"the active party reports that {notice['lost']} left"
        super().__init__(who)
        self.blame, self.notice = blame, notice


class Announced(Exception):
    """At a helper: the active party's word waits (`ANNOUNCEMENTS`: a readmitted party, the rounds' bounds); the
    active party lets the parties go on only after the helper's answer, so no round is combined before it."""


@dataclass(frozen=True)
class Plan:
    """How one role is linked: the address its hub listens on (None: it serves nothing), the roles that may
    connect to that hub, the hubs it dials (role -> address), and the hub that relays to everyone else."""

    serve_at: str | None = None
    accept: tuple[str, ...] = ()
    dial: tuple[tuple[str, str], ...] = ()
    relay: str | None = None


class Network:
    """One role's links (see the module docstring). `hub_class` and `open_channel` are what it listens and
    dials with (mutual TLS); the attack tests replace them to build a deliberately weakened clear transport."""

    hub_class = Hub
    open_channel = staticmethod(secure_channel)
    min_deadline_s = DEADLINE_MIN_S
    rounds_per_wait = ROUNDS_PER_WAIT
    _mail: Mapping[str, deque] = MappingProxyType({})  # (each instance's own, from __init__: a bare one holds none)

    def __init__(self, me: str, key: PrivateKey, pins: dict[str, bytes], plan: Plan,
                 on_delivered: Callable[[str, str, bytes], None] | None = None) -> None:
        self.me, self.plan, self.pins = me, plan, dict(pins)
        wire.NAMES.learn([me, *self.pins, *SETUP])  # every role's name and set-up tag checked once, here
        self._key, self._on_delivered = key, on_delivered
        self.links: dict[str, Link] = {}
        self.traffic: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # tag -> [bytes sent, bytes received]
        self.round: str | None = None
        self.progress = 0  # rounds entered so far (heartbeats carry it: a peer that advances is not stuck)
        self.work = 0  # units of its own work between passes so far (`advanced`; heartbeats carry it too)
        self.waiting_on: str | None = None  # the peer `recv` waits on (heartbeats say so: it is not stuck itself)
        self.waited = 0.0  # seconds `recv` spent blocked until a frame arrived (the transport's timing split)
        self.bounds: dict[str, tuple[int, int]] = dict(SETUP)
        self._rounds_declared = False
        self.slowest = 0.0  # the longest wait for a round's frame on a peer that was not waiting itself
        self.work_units = 0  # the most units of its own work a peer may show in this role's waits (`allow_work`)
        self._credited: dict[str, int] = defaultdict(int)  # units each peer used up in waits past the limit
        # Per sender, bounded where frames arrive: a declared tag, at most its depth waiting (`_queued`, `allow`).
        self._mail: dict[str, deque] = defaultdict(deque)
        self._queued: dict[tuple[str, str], int] = defaultdict(int)  # (sender, tag) -> frames waiting
        self._relays: frozenset[str] = frozenset()  # the roles its hub forwards frames between (`relay_for`)
        self._relaying: dict[tuple[str, str], tuple[str, int]] = {}  # (sender, receiver) -> its open frame's tag, bytes
        self._reassembly, self._byes, self._dismissed = wire.Reassembly(), set(), set()
        self._cond, self._count = threading.Condition(), threading.Lock()
        self._aborted: Blame | None = None
        # Passive parties whose loss this role tolerates (the run's `on_party_loss`); the active party decides.
        self.tolerated: set[str] = set()
        self._coordinator: str | None = None  # the active party (`coordinator`)
        self.lost: dict[str, Blame] = {}
        self._unannounced: list[Blame] = []  # at the active party: losses it has not announced yet
        self._notice: dict | None = None  # elsewhere: the active party's announcement, not yet handled
        self.returning: set[str] = set()  # at the hub: lost parties linked again, not readmitted yet
        self._closing = False
        self._leaving = False
        self._hub: Hub | None = None
        self._channels: list = []
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    # -- set-up ---------------------------------------------------------------------------------------

    def serve(self) -> int | None:
        """Start this role's hub (if it has one); the port it listens on."""
        if self.plan.serve_at is None:
            return None
        trusted = {r: self.pins[r] for r in self.plan.accept}
        material = tls_material(self._key, self.me, trusted)
        self._hub = self.hub_class(self.plan.serve_at, material, trusted, self._arrived, self._link_closed,
                                   self._joined).start()
        self._monitor_once()
        return self._hub.port

    def connect(self, deadline: float, addresses: dict[str, str] | None = None) -> None:
        """Dial every hub of the plan (addresses may be given late, e.g. ports chosen at start-up)."""
        self._monitor_once()
        for peer, address in self.plan.dial:
            address = (addresses or {}).get(peer, address)
            material = tls_material(self._key, self.me, {peer: self.pins[peer]})
            link, channel = dial(address, peer, material, self._arrived, self._link_closed, deadline,
                                 self.open_channel, self.me)
            self._channels.append(channel)
            with self._cond:
                self.links[peer] = link
                self._cond.notify_all()

    def _joined(self, link: Link) -> None:
        with self._cond:
            if self.me == self.coordinator and link.peer in {b.role for b in self._unannounced}:
                link.close()  # its loss is not announced yet: a step may still wait on its earlier process
                return
            if link.peer in self.lost:  # a lost party linked again (runtime/losses.py): its old frames are stale
                self._forget(link.peer)
                self.returning.add(link.peer)
            self.links[link.peer] = link
            self._cond.notify_all()
            if self._aborted is not None:  # linked after the run ended: told why, as the others were
                link.put([self._abort_frame(self._aborted)])

    def forget(self, peer: str) -> None:
        """Drop the frames of a lost peer still waiting here (stale: it may come back, runtime/losses.py)."""
        with self._cond:
            self._forget(peer)
            self._cond.notify_all()

    def _forget(self, peer: str) -> None:
        """Drop everything a lost peer's earlier process left here (under the condition's lock)."""
        self._mail[peer].clear()
        for key in [key for key in self._queued if key[0] == peer]:
            del self._queued[key]
        for key in [key for key in self._relaying if peer in key]:
            del self._relaying[key]
        self._reassembly.forget(peer)
        self._byes.discard(peer)

    def returned(self) -> list[str]:
        """At the hub: the lost parties linked again whose hello waits (each may be readmitted)."""
        with self._cond:
            unannounced = {b.role for b in self._unannounced}
            return sorted(p for p in self.returning - unannounced if self._mail[p] and self._mail[p][0][0] == "hello")

    def readmit(self, peer: str) -> None:
        """A lost party is in the run again (its rejoin was accepted)."""
        with self._cond:
            self.lost.pop(peer, None)
            self.returning.discard(peer)

    def turn_away(self, peer: str) -> None:
        """A returning party whose rejoin was refused: it stays lost, its new link is closed."""
        with self._cond:
            self.returning.discard(peer)
            link = self.links.get(peer)
        if link is not None:
            link.close()

    def wait_for(self, roles: Iterable[str], deadline: float) -> set[str]:
        """The roles among `roles` linked to this role by `deadline` (returns as soon as all are)."""
        wanted = set(roles)
        with self._cond, self._waiting(None):
            while not wanted <= set(self.links) and time.monotonic() < deadline and self._aborted is None:
                self.waiting_on = min(wanted - set(self.links))  # on a role of the run, as heartbeats say (review)
                self._cond.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            return wanted & set(self.links)

    def dismiss(self, peers: Iterable[str]) -> None:
        """Let `peers` go: roles that linked but are not in this run (they leave without ending it)."""
        for peer in peers:
            self._dismissed.add(peer)
            link = self.links.pop(peer, None)
            if link is not None:
                link.close()

    def _monitor_once(self) -> None:
        if not self._monitor.is_alive() and not self._stop.is_set():
            self._monitor.start()

    def relay_for(self, roles: Iterable[str]) -> None:
        """Forward frames between these roles (those its hub accepts): the relay every one of them names in its
        plan. Any other hub forwards nothing (review finding: the he aggregator relayed a passive party's frame to
        another, which then named the honest aggregator for it)."""
        self._relays = frozenset(roles) & frozenset(self.plan.accept) if self.plan.serve_at is not None else frozenset()

    def allow(self, bounds: dict[str, int], depth: int = ROUND_DEPTH) -> None:
        """Accept frames of these tags from now on, each at most its bound in bytes (a method's rounds). A frame of a
        set-up step that is over (BEFORE_ROUNDS) still waiting is dropped and its sender named: an honest peer's
        frames of a step are read before the step ends (review finding: they stayed for the whole run)."""
        with self._cond:
            retired = () if self._rounds_declared else BEFORE_ROUNDS
            for tag in retired:
                self.bounds.pop(tag, None)
            self.bounds.update({tag: (int(size), depth) for tag, size in bounds.items()})
            self._rounds_declared = True
        wire.NAMES.learn(bounds)  # a declared tag is checked once, here, not on its first frame
        self._sweep(lambda src, tag: tag in retired, "of a set-up step that is over, still waiting")

    @property
    def coordinator(self) -> str | None:
        """The active party, once the set-up names it: its `lost` announcements are believed."""
        return self._coordinator

    @coordinator.setter
    def coordinator(self, name: str | None) -> None:
        # Until now a hub that dials nothing (the he aggregator) could not tell which client is the active party:
        # a frame it took from a place that, as it turns out, may not send it is dropped, its sender named.
        with self._cond:
            self._coordinator = name
        self._sweep(lambda src, tag: not self._routed(src, tag), "that its sender may not send this role")

    def _sweep(self, stale: Callable[[str, str], bool], why: str) -> None:
        """Drop every frame waiting here that `stale(sender, tag)`; the run ends naming the first one's sender."""
        dropped = None
        with self._cond:
            for src, mail in list(self._mail.items()):
                kept = [frame for frame in mail if not stale(src, frame[0])]
                for tag, _ in (frame for frame in mail if stale(src, frame[0])):
                    self._queued[src, tag] -= 1
                    dropped = dropped or (src, tag)
                mail.clear()
                mail.extend(kept)
            self._cond.notify_all()
        if dropped is not None:
            self._abort(Blame(dropped[0], "refused", self.round, f"a frame {dropped[1][:40]!r} {why}"))

    def _places(self, role: str) -> set[str]:
        """Where `role` stands in the run as far as this role knows ("active", "passive", "helper"): a passive
        party's plan names the active party (its relay), the active party dials the helpers; a hub that dials
        nothing (the he aggregator, or an active party without one) learns who is the active party at the set-up's
        end (`coordinator`): until then, both places stay possible for it and for its clients."""
        active = self._coordinator or self.plan.relay or (self.me if self.plan.dial else None)
        helpers = {peer for peer, _ in self.plan.dial} - {self.plan.relay}
        if role == active or role in helpers:
            return {"active" if role == active else "helper"}
        if active is None:
            return {"active", "helper"} if role == self.me else {"active", "passive"}
        return {"helper"} if role == self.me and self.plan.serve_at is not None else {"passive"}

    def _routed(self, src: str, tag: str) -> bool:
        """Whether `src` may send this role a frame of `tag` (ROUTES; a round's: ROUND_ROUTES)."""
        routes = ROUTES.get(tag, ROUND_ROUTES)
        return any((s, r) in routes for s in self._places(src) for r in self._places(self.me))

    def tighten(self, bounds: dict[str, int]) -> None:
        """Lower set-up steps' frame bounds from this role's own file (the alignment's by its max_ids); never raises
        one, and a frame that came before is no larger than the bound it came under."""
        with self._cond:
            for tag, size in bounds.items():
                if tag in self.bounds:
                    self.bounds[tag] = (min(self.bounds[tag][0], int(size)), self.bounds[tag][1])

    @property
    def deadline_s(self) -> float:
        """How long a peer may heartbeat without delivering a round's frame (see DEADLINE_FACTOR), never past
        RECV_TIMEOUT_S: a peer that made each round slower grew it twentyfold per round (and with it the waits
        for acknowledgements that it bounds)."""
        return min(max(self.min_deadline_s, DEADLINE_FACTOR * self.slowest), max(RECV_TIMEOUT_S, self.min_deadline_s))

    # -- messages ---------------------------------------------------------------------------------------

    def send(self, dst: str, tag: str, payload: bytes) -> None:
        """Deliver `payload` to role `dst` under `tag` (direct link, else through the relay hub)."""
        if self._aborted is not None:  # `_raise_if_aborted`, read in place on every frame sent
            raise RunAborted(self._aborted)
        if dst in self.lost and dst not in self.returning:
            return  # gone: a step that still addresses it is being abandoned
        link = self.links.get(dst) or (self.links.get(self.plan.relay) if self.plan.relay else None)
        if link is None:
            raise PartyFailure(f"{self.me} has no link to {dst}")
        sent = link.put(wire.fragments(wire.Kind.DATA, self.me, dst, tag, payload))
        with self._count:
            self.traffic[tag][0] += sent
        # A peer that stops reading its stream holds this role here, and is named once it takes nothing for a
        # deadline (review finding: its frames piled up in this role's memory for as long as the run went on);
        # meanwhile the heartbeats say this role waits on it, so a third party does not name this role instead.
        bound = max(RELAY_QUEUE_BYTES, ROUND_DEPTH * self.bounds.get(tag, (0, 0))[0])
        if link.queued > bound:
            with self._waiting(link.peer):
                self._await_drain(None, link, bound)
        self._raise_if_aborted()

    def recv(self, src: str, tag: str, limit_s: float = RECV_TIMEOUT_S) -> bytes:
        """The next frame from `src`; a `ProtocolError` if it is not a `tag` frame."""
        got, payload = self.recv_any(src, tag, limit_s)
        if got != tag:  # the sender's refusal: every role reads who (red team: the others read the receiver failed)
            raise Refused(f"round {tag!r}: field 'round': {src} sent {got!r} instead", src)
        return payload

    def recv_any(self, src: str, expecting: str = "a frame", limit_s: float = RECV_TIMEOUT_S) -> tuple[str, bytes]:
        """The next frame from `src` and its tag (a role that follows another's lead, e.g. the aggregator)."""
        began, wait = time.monotonic(), None
        with self._cond:
            self.waiting_on, excused = src, False
            try:
                # frames that came before a loss are still read (the runs stay repeatable); a party's ack of a loss
                # waits for the active party's announcement of it, which may come later on its own link
                while not self._mail[src] or (self._ack_ahead(src, expecting) and self._notice is None):
                    wait = wait or Wait.of(self.links)  # only a wait that blocks counts the peers' work
                    self._raise_if_lost(src, expecting)
                    excused = self._check_wait(src, expecting, wait, limit_s) or excused
                    self._cond.wait(0.5)
            finally:
                self.waiting_on = None
                if wait is not None:
                    self._credit(wait, limit_s)
            if self._notice is not None and (self._mail[src][0][0] == "lost" or self._ack_ahead(src, expecting)):
                # every earlier frame was read: now the announcement (review finding: the ack was taken as a round's
                # frame, and the drain after the loss then ate the party's next step's frame: all waited 900 s)
                raise PartyLost(notice=self._notice)
            waited = time.monotonic() - began
            self.waited += waited
            tag, payload = self._mail[src].popleft()
            self._queued[src, tag] -= 1
            self._cond.notify_all()  # a reader held for this sender and tag may go on
            if not excused and self.round is not None:
                self.slowest = max(self.slowest, waited)
        with self._count:  # counted when taken, so a frame that came early counts in the round that reads it
            self.traffic[tag][1] += len(payload)
        return tag, payload

    def _ack_ahead(self, src: str, expecting: str) -> bool:
        """`src`'s next frame acknowledges a loss where this role, not the active party, expects another frame."""
        return self._mail[src][0][0] == "lost-ack" and expecting != "lost-ack" and self.me != self._coordinator

    def _raise_if_lost(self, src: str, expecting: str = "") -> bool:
        """Raise `PartyLost` for a loss this role must act on now (False otherwise): at the active party one it
        has not announced, once it waits on the lost party (or on a helper, which waits on it), elsewhere the
        active party's announcement. So every role abandons the step at the same round, whatever the timing."""
        unannounced = {b.role for b in self._unannounced}
        gone = src in self.lost and (src not in self.returning or src in unannounced)
        if unannounced and self.me == self.coordinator and (gone or src not in self.tolerated) and \
                expecting not in ACKS:  # (a helper's answer to the active party's word comes whoever left)
            raise PartyLost(blame=self._unannounced[0])  # a party still here delivers: its step goes on
        if self._notice is not None:
            raise PartyLost(notice=self._notice)
        if gone and self.me == self.coordinator:  # (elsewhere the active party's announcement comes)
            raise PartyFailure(f"{src} left the run while {self.me} waited for a frame of it")
        if src != self.coordinator and self.head(self.coordinator) in ANNOUNCEMENTS:
            raise Announced()  # a helper: the active party's word comes before the next round
        return False

    def head(self, src: str | None) -> str | None:
        """The tag of the next frame from `src`, not taken (None: nothing waits)."""
        with self._cond:
            return self._mail[src][0][0] if src is not None and self._mail[src] else None

    def take_losses(self) -> list[Blame]:
        """At the active party: the losses to announce (each once)."""
        with self._cond:
            losses, self._unannounced = self._unannounced, []
            return losses

    def take_notice(self) -> dict:
        """The active party's announcement, handled: frames it sent before it are dropped (stale)."""
        with self._cond:
            notice, self._notice = self._notice, None
        self.drain(self.coordinator, "lost")
        return notice

    def drain(self, peer: str, marker: str) -> bytes | None:
        """Drop `peer`'s frames up to its `marker` frame (frames of an abandoned step); the marker's payload, or
        None where the peer was lost meanwhile (it has nothing more to send). A peer whose marker does not come
        within its deadline is named: the run ends, or it is lost where tolerated (then None)."""
        began = time.monotonic()
        with self._cond, self._waiting(peer):  # the heartbeats say so: a peer waiting on this role does not name it
            while time.monotonic() - began <= self.deadline_s:
                while self._mail[peer]:
                    tag, payload = self._mail[peer].popleft()
                    self._queued[peer, tag] -= 1
                    self._cond.notify_all()
                    if tag == marker:
                        return payload
                self._raise_if_aborted()
                if peer in self.lost or peer in self._byes:
                    return None
                self._cond.wait(0.5)
        # (before: the wait ended in silence, and the run went on as if the peer had answered)
        self._blamed(Blame(peer, "stuck", self.round, f"no {marker!r} frame within {self.deadline_s:.3g} s"))
        return None

    @contextmanager
    def _waiting(self, peer: str | None):
        """Heartbeats say this role waits on `peer` meanwhile (a loop may name another), then what they said before."""
        before, self.waiting_on = self.waiting_on, peer
        try:
            yield
        finally:
            self.waiting_on = before

    def _check_wait(self, src: str, expecting: str, wait: Wait, limit_s: float = RECV_TIMEOUT_S) -> bool:
        """Raise if the wait on `src` must end; True if `src` is excused (waiting on someone, or not in a round)."""
        self._raise_if_aborted()
        now, link = time.monotonic(), self.links.get(src)
        last_round = link.last_round if link is not None else None
        if src in self._byes:  # its goodbye follows its last frame on the same stream: none is coming
            return self._blamed(Blame(src, "left", last_round or self.round,
                                      f"its goodbye came while {self.me} waited for {expecting!r}"))
        excused = link is None or self.round is None or self._waits_on_another(src, link) or link.last_round is None
        if now - self._counted_work(src, wait) > limit_s:
            if self._may_wait_in_turn(src, link):  # on the culprit: this role fails alone (review: an honest middle
                raise PartyFailure(f"{self.me} waited {limit_s:.0f} s for {expecting!r} from {src}, which made no "
                                   "progress it could count meanwhile")  # named)
            # a linked peer waiting on nobody it may wait on, in set-up or working alone as well as in a round
            return self._blamed(Blame(src, "stuck", last_round, f"no progress in {limit_s:.0f} s for {expecting!r}"))
        if excused:
            return True  # no deadline: set-up, a relayed peer, a peer waiting on another, or one between passes
        if now - wait.renewed(src, link, self.rounds_per_wait) > self.deadline_s:  # (the condition's lock is reentrant)
            self._blamed(Blame(src, "stuck", link.last_round, f"none for {self.deadline_s:.0f} s"))
        return False

    def _may_wait_in_turn(self, src: str, link: Link | None) -> bool:
        """At the wait's limit: whether `src` may itself be waiting on the culprit. A relayed peer has no heartbeat
        here; outside a round any role of the run it says it waits on may hold it (the alignment's relayed ring);
        in a round only a wait `_waits_on_another` believes (review: any claim, in a round too, or of a name no role
        has, had this role fail in its place)."""
        if link is None:
            return True
        if self.round is None or link.last_round is None:
            return link.waiting_on in self.pins and link.waiting_on != src
        return self._waits_on_another(src, link)

    def _blamed(self, blame: Blame) -> bool:
        """A peer that holds this role's wait up is named: the run ends, or the peer is lost where tolerated."""
        self._fault(blame)
        self._raise_if_aborted()
        return True

    def _waits_on_another(self, src: str, link: Link) -> bool:
        """`src`'s heartbeat says it waits on a third role that may send it round frames (a passive party on the
        active party, the he aggregator on a passive party): that role's own deadline covers it. A claim to wait on
        a role that never sends it a round's frame, or on this role once nothing is in flight to it, excuses nothing
        (red team: a stalled passive party said it waited on another passive party and was never named)."""
        other = link.waiting_on
        if not other:
            return False
        if other == self.me:  # only while this role's frame to it is still in flight (a slow link: review)
            return link.queued > 0
        return any((s, r) in ROUND_ROUTES for s in self._places(other) for r in self._places(src))

    def _counted_work(self, src: str, wait: Wait) -> float:
        """When the active party last showed a unit of its own work (`advanced`) this wait may count, as `src` or
        as the peer `src` says it waits on (only it works alone; the he aggregator waits on passive parties that
        wait on it), while its units since the wait began stay within what is left of those this role's own
        schedule allows in the whole run (`allow_work`); past that, none counts. Else when the wait began, and never
        earlier than a time it counted before in this wait (whom a peer waits on changes between its receives)."""
        link = self.links.get(src)
        for peer in {src, link.waiting_on} & {self.coordinator} if link is not None else ():  # only it works alone
            if (other := self.links.get(peer)) is None:
                continue
            shown = wait.shown(peer, other)
            if shown > self.work_units - self._credited[peer]:
                return wait.began  # more units than its schedule has: a peer that would stall this role
            if shown > 0:
                wait.latest = max(wait.latest, other.worked_at)
        return wait.latest

    def _credit(self, wait: Wait, limit_s: float) -> None:
        """After a wait that outlasted `limit_s`: every peer's units of work during it are used up from its
        allowance (a peer extends this role's waits by at most its schedule's units in all)."""
        if time.monotonic() - wait.began <= limit_s:
            return
        for peer in wait.seen:
            if (link := self.links.get(peer)) is not None:
                self._credited[peer] += max(0, wait.shown(peer, link))

    def enter(self, round_name: str) -> None:
        """The round this role is in (heartbeats carry it, so a stall is reported with it)."""
        self.round = round_name
        self.progress += 1

    def between_passes(self) -> None:
        """This role finished a pass of rounds: until the next, it does work of its own (its peers then wait
        on it without a round deadline, up to RECV_TIMEOUT_S from its last progress)."""
        self.round = None

    def allow_work(self, units: int) -> None:
        """From this role's own schedule: the most units of its own work (`advanced`) a peer may show in all while
        this role waits on it past RECV_TIMEOUT_S; beyond them its progress no longer extends a wait."""
        self.work_units = max(0, int(units))

    def advanced(self) -> None:
        """This role finished one unit of its own work between passes (an epoch of a cached stage 2, one of
        its tree fits): its heartbeat shows the progress, so a peer waiting on it gets RECV_TIMEOUT_S again."""
        self.progress += 1
        self.work += 1

    def _arrived(self, link: Link, envelope: wire.Envelope) -> None:
        """Every envelope from every link, on that link's reader thread; a malformed one ends the run."""
        try:
            self._dispatch(link, envelope)
        except Refused as refusal:
            self._abort(Blame(refusal.offender or link.peer, "refused", link.last_round, str(refusal)))
        except ProtocolError:
            self._abort(Blame(link.peer, "failed", link.last_round, "a malformed or misaddressed frame"))

    def _dispatch(self, link: Link, envelope: wire.Envelope) -> None:
        if link.peer in self._dismissed:
            return  # a role that is not in this run has nothing more to say to it
        if envelope.kind is wire.Kind.HEARTBEAT:
            if not link.beat_within(HEARTBEAT_S):  # (red team: 3 million beats took most of a core, unnamed)
                raise Refused(f"{link.peer} sent heartbeats far faster than one each {HEARTBEAT_S:g} s", link.peer)
            link.heard(*_beat_of(envelope.payload))
        elif envelope.kind is wire.Kind.ABORT and link.peer in self.lost:  # a lost party's stop ends its return only
            self._fault(Blame(link.peer, "left", link.last_round))
        elif envelope.kind is wire.Kind.ABORT:  # believed as its sender's word only
            blame = _blame_of(envelope.payload, link.peer, self.pins)
            self._abort(replace(blame, by=link.peer), flood_except=link.peer)
        elif envelope.kind is wire.Kind.BYE:
            with self._cond:
                self._byes.add(link.peer)
                self._cond.notify_all()
        elif envelope.dst != self.me:
            self._relay(link, envelope)
        else:
            self._deliver(link, envelope)

    def _relay(self, link: Link, envelope: wire.Envelope) -> None:
        """Forward a frame's fragment between two roles it relays for; the sender on the link answers for it."""
        target, key = self._relay_target(link, envelope), (link.peer, envelope.dst)
        tag, size = self._relaying.get(key, (envelope.tag, 0))
        if tag != envelope.tag:  # (the receiver, which joins per sender, would have named this hub for it)
            raise Refused(f"{link.peer} interleaved a frame {envelope.tag[:40]!r} into its frame {tag[:40]!r} to "
                          f"{envelope.dst}", link.peer)
        size += len(envelope.payload)
        if size > self._bound(envelope, link.peer)[0]:
            raise Refused(f"a frame {tag[:40]!r} over its bound of {self._bound(envelope, link.peer)[0]} bytes",
                          link.peer)
        if envelope.more:
            self._relaying[key] = (tag, size)
        else:
            self._relaying.pop(key, None)
        target.put([wire.encode(envelope)])
        self._await_drain(link, target)

    def _relay_target(self, link: Link, envelope: wire.Envelope) -> Link:
        """The link to forward to: only from a role this hub relays for, as itself, to another (`relay_for`)."""
        target = self.links.get(envelope.dst) if self._hub is not None else None
        if envelope.src != link.peer or envelope.dst == link.peer or target is None or \
                not {link.peer, envelope.dst} <= self._relays:
            raise Refused(f"{link.peer} sent a frame as {envelope.src[:40]!r} to {envelope.dst[:40]!r}, which "
                          f"{self.me} does not relay", link.peer)
        return target

    def _await_drain(self, sender: Link | None, target: Link, bound: int = RELAY_QUEUE_BYTES) -> None:
        """Hold the sender's stream back (flow control; None: this role's own program, in `send`) while more than
        `bound` bytes wait for `target`. The sender is excused meanwhile (`held`: review finding, it was named as
        stalled after STALL_S for the receiver's slowness), and a target that takes none of them for `deadline_s`
        is named instead. Its own progress excuses it (a receiver behind, whose reader waits for its program, is
        not stuck) only until `deadline_s` after the wait began (review finding: a heartbeat counting up excused
        it for ever)."""
        last, began = target.queued, time.monotonic()
        moved = began

        def excused(link: Link) -> float:  # a receiver's own progress, for one deadline; none where this role sends
            return min(link.progressed_at, began + self.deadline_s) if sender is not None else began
        if sender is not None:
            sender.held = True
        try:
            while target.open and target.peer not in self.lost and target.queued > bound and self._aborted is None:
                if target.queued < last:
                    last, moved = target.queued, time.monotonic()
                elif time.monotonic() - max(moved, excused(target)) > self.deadline_s:
                    self._fault(Blame(target.peer, "stuck", target.last_round,
                                      f"took none of the frames waiting for it for {self.deadline_s:.0f} s"))
                    return
                time.sleep(0.005)
        finally:
            if sender is not None:
                sender.held, sender.last_seen = False, time.monotonic()

    def _hold(self, link: Link, key: tuple[str, str], depth: int) -> None:
        """Hold this link's reader (gRPC flow control then holds its sender) while `depth` frames of the
        sender and tag wait unread: a sender ahead of the rounds buffers in its own memory, not here."""
        with self._cond:
            link.held = self._queued[key] >= depth
            while self._queued[key] >= depth and self._aborted is None and not self._leaving:
                self._cond.wait(0.5)
            link.held, link.last_seen = False, time.monotonic()

    def _bound(self, envelope: wire.Envelope, offender: str) -> tuple[int, int]:
        """The declared (largest frame, frames waiting) of the envelope's tag; an undeclared tag is refused."""
        bound = self.bounds.get(envelope.tag)
        if bound is None and envelope.tag in EARLY and not self._rounds_declared:
            return EARLY_BYTES, 1
        if bound is None:
            raise Refused(f"a frame with the undeclared tag {envelope.tag[:40]!r}", offender)
        return bound

    def _deliver(self, link: Link, envelope: wire.Envelope) -> None:
        relayed = envelope.src != link.peer
        if relayed and (link.peer != self.plan.relay or envelope.src not in self.pins or envelope.src == self.me):
            raise ProtocolError(f"{link.peer} sent a frame as {envelope.src!r}: refused")  # (names the hub: an
            # invented sender would get a depth and a reassembly of its own per name)
        size, depth = self._bound(envelope, envelope.src)
        if not self._routed(envelope.src, envelope.tag):
            raise Refused(f"a frame {envelope.tag[:40]!r}, which {envelope.src} may not send {self.me}", envelope.src)
        if self._aborted is not None:
            return  # the run has ended: nothing more is read (a peer that caused the end cannot queue more)
        if envelope.src == link.peer and self._reassembly.starts(envelope):
            self._hold(link, (envelope.src, envelope.tag), depth)  # before its first byte: the sender keeps it
        whole = self._reassembly.add(envelope, size)
        if whole is None or self._leaving:
            return
        with self._cond:
            if whole.src != link.peer and self._queued[whole.src, whole.tag] >= depth:  # relayed: holding the
                raise Refused(f"more than {depth} frames {whole.tag!r} ahead (relayed by {link.peer}, which could "
                              "have sent them itself)", whole.src)  # link would hold all
        self._hold(link, (whole.src, whole.tag), depth)
        with self._cond:
            self._queued[whole.src, whole.tag] += 1
        if self._on_delivered is not None:
            self._on_delivered(whole.src, whole.tag, whole.payload)
        with self._cond:
            self._mail[whole.src].append((whole.tag, whole.payload))
            if whole.tag == "lost" and whole.src == self.coordinator and self.me != self.coordinator:
                self._notice = self._lost_notice(whole.payload)
            self._cond.notify_all()

    def _lost_notice(self, payload: bytes) -> dict:
        """The active party's announcement, naming only roles of this run other than itself (sums.py and
        losses.py look each up: an unknown one raised a ValueError there, naming nobody)."""
        notice = _notice_of(payload)
        if not set(notice["lost"]) <= set(self.pins) - {self.coordinator}:
            raise ProtocolError("the active party's announcement of a lost party names a role not in this run")
        return notice

    # -- liveness -------------------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            state = f"{self.round or ''}\t{self.progress}\t{self.waiting_on or ''}\t{self.work}"
            beat = wire.encode(wire.Envelope(wire.Kind.HEARTBEAT, self.me, "", "", state.encode("ascii", "replace")))
            now = time.monotonic()
            for link in list(self.links.values()):
                if link.open:
                    link.put([beat])
                if not self._closing and link.open and not link.held and now - link.last_seen > STALL_S:
                    self._fault(Blame(link.peer, "stalled", link.last_round or self.round))

    def _link_closed(self, link: Link, reason: str | None) -> None:
        if self.links.get(link.peer) not in (link, None):
            return  # an earlier link of a party that linked again
        if not self._closing and link.peer not in self._byes | self._dismissed:  # rounds run in step
            self._fault(Blame(link.peer, "left", link.last_round or self.round))

    def _fault(self, blame: Blame) -> None:
        """A peer left, stalled or stuck: a tolerated party is lost (the run goes on without it), else the run ends."""
        if blame.role not in self.tolerated:
            self._abort(blame)
            return
        with self._cond:
            if blame.role in self.lost:
                self.returning.discard(blame.role)  # a returning party that left again stays lost
                return
            self.lost[blame.role] = blame
            self._unannounced.append(blame)
            link = self.links.get(blame.role)
            self._cond.notify_all()
        if link is not None:
            link.close()

    def fail(self, blame: Blame) -> None:
        """This role ends the run: every peer is told (and told on), who and how only."""
        self._abort(blame)

    def refuse(self, refusal: Refused, round: str | None = None, by: str = "") -> RunAborted:
        """This role's program refuses a peer's frame: the run ends naming `refusal.offender`, as a refusal where
        frames arrive does (`by`: the role whose word it rests on, if not this role's own); the error to raise."""
        self._abort(Blame(refusal.offender or self.me, "refused", round or self.round, str(refusal), by))
        return RunAborted(self._aborted)

    def _abort(self, blame: Blame, flood_except: str | None = None) -> None:
        with self._cond:
            if self._aborted is not None:
                return
            self._aborted = blame
            self._cond.notify_all()
        message = self._abort_frame(blame)
        for peer, link in list(self.links.items()):
            if peer != flood_except and link.open:
                link.put([message])

    def _abort_frame(self, blame: Blame) -> bytes:
        """The ABORT every peer is told, its texts as a peer accepts them (`_blame_of`: a refusal's text may be
        longer than TEXT_CHARS, and its full text stays here)."""
        sent = replace(blame, round=None if blame.round is None else _plain(blame.round), kind=_plain(blame.kind))
        return wire.encode(wire.Envelope(wire.Kind.ABORT, self.me, "", "", json.dumps(asdict(sent)).encode()))

    @property
    def aborted(self) -> Blame | None:
        return self._aborted

    def _raise_if_aborted(self) -> None:
        if self._aborted is not None:
            raise RunAborted(self._aborted)

    # -- the end --------------------------------------------------------------------------------------

    def close(self, clean: bool) -> None:
        """Leave: after a clean run, a goodbye barrier (every role's last frames are delivered first)."""
        with self._cond:
            self._leaving = True  # nothing more is read: frames still arriving are dropped, held readers let go
            self._cond.notify_all()
        if clean and self._aborted is None:
            self._goodbye()
        self._closing = True
        self._stop.set()
        for link in list(self.links.values()):
            link.close()
        self._linger()
        if self._hub is not None:
            self._hub.stop()
        for channel in self._channels:
            channel.close()

    def _linger(self) -> None:
        """Up to LINGER_S for the last frames (an abort's word) to leave: closing a channel ends its stream at
        once, so a dialed link waits for its peer to end it, a served one for gRPC to take its last frame."""
        dialed = {peer for peer, _ in self.plan.dial}
        deadline = time.monotonic() + LINGER_S
        for peer, link in list(self.links.items()):
            done = link.ended if peer in dialed else link.sent_all
            if not link.ended.is_set():
                done.wait(max(0.0, deadline - time.monotonic()))

    def _goodbye(self) -> None:
        bye = wire.encode(wire.Envelope(wire.Kind.BYE, self.me, "", ""))
        dialed = [peer for peer, _ in self.plan.dial]
        for peer in dialed:
            self.links[peer].put([bye])
        clients = [peer for peer in self.links if peer not in dialed]
        self._await_byes(clients)
        self._closing = True  # the clients leave once they have our goodbye
        for peer in clients:
            self.links[peer].put([bye])
        self._await_byes(dialed)

    def _await_byes(self, peers: list[str]) -> None:
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        with self._cond:
            while any(p not in self._byes and self.links[p].open for p in peers) and time.monotonic() < deadline:
                self._cond.wait(0.2)


def _blame_of(payload: bytes, sender: str, roles: Collection[str] = ()) -> Blame:
    """The blame an ABORT carries (fixed fields: one of `roles`, one of HOWS, a round and a kind of plain text, see
    TEXT_CHARS); a malformed one blames its sender (review finding: any text up to a message's size, control
    characters included, was printed and forwarded)."""
    try:
        record = wire.peer_json(payload)
        fields = {k: record[k] for k in ("role", "how", "round", "kind")}  # `by`: set by the receiver
        if fields["role"] not in roles or fields["how"] not in HOWS or not _is_plain(fields["kind"]) or \
                not (fields["round"] is None or _is_plain(fields["round"])):
            raise TypeError
        return Blame(**fields)
    except (ValueError, KeyError, TypeError):
        return Blame(sender, "failed", None, "a malformed abort")


def _is_plain(text: object, limit: int = TEXT_CHARS) -> bool:
    """At most `limit` printable ASCII characters (nothing that moves a terminal's cursor or floods a log)."""
    return isinstance(text, str) and len(text) <= limit and text.isascii() and text.isprintable()


def _plain(text: str) -> str:
    """`text` as a peer accepts it (`_is_plain`): other characters as '?', cut to TEXT_CHARS."""
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in text[:TEXT_CHARS])


def _beat_of(payload: bytes) -> tuple[str | None, int, str | None, int]:
    """(round, rounds entered, the peer it waits on, units of its own work) of a heartbeat; one not of four fields
    reads as no progress, and a round or a role name (255 characters, as an envelope's) that is no plain text
    (`_is_plain`) or a count of more than COUNT_DIGITS digits is refused, naming its sender."""
    fields = payload.decode("ascii", "replace").split("\t")
    round, progress, waiting, work = (fields + ["", "0", "", "0"])[:4] if len(fields) <= 4 else ("", "0", "", "0")
    if not (_is_plain(round) and _is_plain(waiting, 255)) or max(len(progress), len(work)) > COUNT_DIGITS:
        raise Refused("a heartbeat that is not a round, a role and two counts of plain text")
    count = [int(v) if v.isdigit() else 0 for v in (progress, work)]
    return round or None, count[0], waiting or None, count[1]


def _notice_of(payload: bytes) -> dict:
    """The active party's announcement of a loss: who left and where every role resumes (fixed fields)."""
    try:
        record = wire.peer_json(payload)
        notice = {"lost": [str(n) for n in record["lost"]], **{k: int(record[k]) for k in NOTICE_PLACE}}
    except (ValueError, KeyError, TypeError, OverflowError):  # (OverflowError: int() of a JSON Infinity)
        raise ProtocolError("the active party's announcement of a lost party is malformed") from None
    return notice


def where_in_run(round_name: str | None) -> str:
    """Where a role was when something happened, for a one-line report: a round, or none running."""
    return f" in round {round_name!r}" if round_name else " while no round was running (set-up, alignment or shut-down)"


# Where a loss notice says the run goes on: the stage, epoch and step, and that step's place among all the run's
# collective batches (runtime/losses.py `PartyLoss.plan`)
NOTICE_PLACE = ("stage", "epoch", "index", "plan")


def notice_digest(notice: dict) -> bytes:
    """SHA-256 of a loss notice's fields (who is out, where the run goes on): what a party's `lost-ack` carries,
    so that the he aggregator can tell whether every party was told what it was."""
    fields = {"lost": sorted(notice["lost"]), **{k: int(notice[k]) for k in NOTICE_PLACE}}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()


def epoch_notice(payload: bytes) -> dict:
    """The active party's word at an epoch's start: the stage, epoch, membership version and the key entries of
    the parties that rejoined (fixed fields; each key is checked against its owner's pin by `accept_key`)."""
    try:
        record = wire.peer_json(payload)
        notice = {k: int(record[k]) for k in ("stage", "epoch", "version")}
        joined = record["joined"]
        if not isinstance(joined, list) or set(record) != {"stage", "epoch", "version", "joined"}:
            raise TypeError
        names = [e["record"]["name"] for e in joined]
        if not all(isinstance(n, str) for n in names):
            raise TypeError
    except (ValueError, KeyError, TypeError, OverflowError):  # (OverflowError: int() of a JSON Infinity)
        raise ProtocolError("the active party's epoch frame is malformed") from None
    return {**notice, "joined": joined}
