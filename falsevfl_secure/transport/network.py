"""One role's view of the federation's links: who it can reach, what arrived from whom, who is alive.

A `Network` owns the role's links (`transport.link`): the hub it serves, if any, and the hubs it dials.
`send(dst, tag, payload)` goes over the direct link to `dst`, or through the relay hub (the active party)
when there is none; a hub forwards an envelope only after checking that its sender is the authenticated
peer of the stream it came on, so nobody can speak for another role. `recv(src, tag)` returns the next
frame from `src` (frames from one sender arrive in order) and refuses one with another tag.

Liveness. Both ends of every link send a heartbeat each `HEARTBEAT_S` naming the round they are in. A peer
silent for `STALL_S` is stalled, a link that closes without a goodbye means its peer left: either ends the
run at this role, which tells every peer it is linked to (`ABORT`, flooded onward once), so every role
fails within about `STALL_S` naming the role and round. An ABORT carries only who, how and in which round:
never a value, never another role's error text. `close()` is a goodbye barrier, so a role leaves only
when everybody is done with it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from ..errors import PartyFailure, ProtocolError
from ..secure.identity import PrivateKey, tls_material
from . import wire
from .link import Hub, Link, dial, secure_channel

HEARTBEAT_S = 1.0
STALL_S = 10.0
RECV_TIMEOUT_S = 900.0  # only a deadlock reaches this: liveness ends a run with a dead or stalled peer first
CLOSE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Blame:
    """Why a run ended, as it may cross a party boundary: the role, how ("stalled", "left", "failed")
    and its last round; `kind` is the error type for "failed" (its text stays with its owner)."""

    role: str
    how: str
    round: str | None = None
    kind: str = ""

    def text(self) -> str:
        where = f" in round {self.round!r}" if self.round else " outside the rounds (start-up or shut-down)"
        what = {"stalled": f"stalled (no heartbeat for {STALL_S:.0f} s)", "left": "left (its connection closed)",
                "failed": f"stopped with an error of its own ({self.kind or 'see its output'})"}.get(self.how, self.how)
        return f"{self.role} {what}{where}"


class RunAborted(PartyFailure):
    """The run ended because of another role (or this one's own failure was announced); `blame` says which."""

    def __init__(self, blame: Blame) -> None:
        super().__init__(blame.text())
        self.blame = blame


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

    def __init__(self, me: str, key: PrivateKey, pins: dict[str, bytes], plan: Plan,
                 on_delivered: Callable[[str, str, bytes], None] | None = None) -> None:
        self.me, self.plan, self.pins = me, plan, dict(pins)
        self._key, self._on_delivered = key, on_delivered
        self.links: dict[str, Link] = {}
        self.traffic: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # tag -> [bytes sent, bytes received]
        self.round: str | None = None
        self.waited = 0.0  # seconds `recv` spent blocked until a frame arrived (the transport's timing split)
        self._mail: dict[str, deque] = defaultdict(deque)
        self._reassembly, self._byes, self._dismissed = wire.Reassembly(), set(), set()
        self._cond, self._count = threading.Condition(), threading.Lock()
        self._aborted: Blame | None = None
        self._closing = False
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
            self.links[link.peer] = link
            self._cond.notify_all()

    def wait_for(self, roles: Iterable[str], deadline: float) -> set[str]:
        """The roles among `roles` linked to this role by `deadline` (returns as soon as all are)."""
        wanted = set(roles)
        with self._cond:
            while not wanted <= set(self.links) and time.monotonic() < deadline and self._aborted is None:
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

    # -- messages ---------------------------------------------------------------------------------------

    def send(self, dst: str, tag: str, payload: bytes) -> None:
        """Deliver `payload` to role `dst` under `tag` (direct link, else through the relay hub)."""
        self._raise_if_aborted()
        link = self.links.get(dst) or (self.links.get(self.plan.relay) if self.plan.relay else None)
        if link is None:
            raise PartyFailure(f"{self.me} has no link to {dst}")
        sent = link.put(wire.fragments(wire.Kind.DATA, self.me, dst, tag, payload))
        with self._count:
            self.traffic[tag][0] += sent

    def recv(self, src: str, tag: str) -> bytes:
        """The next frame from `src`; a `ProtocolError` if it is not a `tag` frame."""
        got, payload = self.recv_any(src, tag)
        if got != tag:
            raise ProtocolError(f"round {tag!r}: field 'round': {src} sent {got!r} instead")
        return payload

    def recv_any(self, src: str, expecting: str = "a frame") -> tuple[str, bytes]:
        """The next frame from `src` and its tag (a role that follows another's lead, e.g. the aggregator)."""
        began = time.monotonic()
        deadline = began + RECV_TIMEOUT_S
        with self._cond:
            while not self._mail[src]:
                self._raise_if_aborted()
                if src in self._byes:  # its goodbye follows its last frame on the same stream: none is coming
                    raise PartyFailure(f"{src} left the run while {self.me} waited for {expecting!r}")
                if time.monotonic() > deadline:
                    raise PartyFailure(f"{self.me} waited {RECV_TIMEOUT_S:.0f} s for {expecting!r} from {src}")
                self._cond.wait(0.5)
            self.waited += time.monotonic() - began
            tag, payload = self._mail[src].popleft()
        with self._count:  # counted when taken, so a frame that came early counts in the round that reads it
            self.traffic[tag][1] += len(payload)
        return tag, payload

    def enter(self, round_name: str) -> None:
        """The round this role is in (heartbeats carry it, so a stall is reported with it)."""
        self.round = round_name

    def _arrived(self, link: Link, envelope: wire.Envelope) -> None:
        """Every envelope from every link, on that link's reader thread; a malformed one ends the run."""
        try:
            self._dispatch(link, envelope)
        except ProtocolError:
            self._abort(Blame(link.peer, "failed", link.last_round, "a malformed or misaddressed frame"))

    def _dispatch(self, link: Link, envelope: wire.Envelope) -> None:
        if link.peer in self._dismissed:
            return  # a role that is not in this run has nothing more to say to it
        if envelope.kind is wire.Kind.HEARTBEAT:
            link.last_round = envelope.payload.decode("ascii", "replace") or None
        elif envelope.kind is wire.Kind.ABORT:
            self._abort(_blame_of(envelope.payload, link.peer), flood_except=link.peer)
        elif envelope.kind is wire.Kind.BYE:
            with self._cond:
                self._byes.add(link.peer)
                self._cond.notify_all()
        elif envelope.dst != self.me:
            self._relay(link, envelope)
        else:
            self._deliver(link, envelope)

    def _relay(self, link: Link, envelope: wire.Envelope) -> None:
        target = self.links.get(envelope.dst) if self._hub is not None else None
        if envelope.src != link.peer or target is None:
            raise ProtocolError(f"{link.peer} sent a frame as {envelope.src!r} to {envelope.dst!r}: refused")
        target.put([wire.encode(envelope)])

    def _deliver(self, link: Link, envelope: wire.Envelope) -> None:
        if envelope.src != link.peer and link.peer != self.plan.relay:
            raise ProtocolError(f"{link.peer} sent a frame as {envelope.src!r}: refused")
        whole = self._reassembly.add(envelope)
        if whole is None:
            return
        if self._on_delivered is not None:
            self._on_delivered(whole.src, whole.tag, whole.payload)
        with self._cond:
            self._mail[whole.src].append((whole.tag, whole.payload))
            self._cond.notify_all()

    # -- liveness -------------------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            beat = wire.encode(wire.Envelope(wire.Kind.HEARTBEAT, self.me, "", "", (self.round or "").encode()))
            now = time.monotonic()
            for link in list(self.links.values()):
                if link.open:
                    link.put([beat])
                if not self._closing and link.open and now - link.last_seen > STALL_S:
                    self._abort(Blame(link.peer, "stalled", link.last_round or self.round))

    def _link_closed(self, link: Link, reason: str | None) -> None:
        if not self._closing and link.peer not in self._byes | self._dismissed:  # rounds run in step
            self._abort(Blame(link.peer, "left", link.last_round or self.round))

    def fail(self, blame: Blame) -> None:
        """This role ends the run: every peer is told (and told on), who and how only."""
        self._abort(blame)

    def _abort(self, blame: Blame, flood_except: str | None = None) -> None:
        with self._cond:
            if self._aborted is not None:
                return
            self._aborted = blame
            self._cond.notify_all()
        message = wire.encode(wire.Envelope(wire.Kind.ABORT, self.me, "", "", json.dumps(asdict(blame)).encode()))
        for peer, link in list(self.links.items()):
            if peer != flood_except and link.open:
                link.put([message])

    @property
    def aborted(self) -> Blame | None:
        return self._aborted

    def _raise_if_aborted(self) -> None:
        if self._aborted is not None:
            raise RunAborted(self._aborted)

    # -- the end --------------------------------------------------------------------------------------

    def close(self, clean: bool) -> None:
        """Leave: after a clean run, a goodbye barrier (every role's last frames are delivered first)."""
        if clean and self._aborted is None:
            self._goodbye()
        self._closing = True
        self._stop.set()
        for link in list(self.links.values()):
            link.close()
        if self._hub is not None:
            self._hub.stop()
        for channel in self._channels:
            channel.close()

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


def _blame_of(payload: bytes, sender: str) -> Blame:
    """The blame an ABORT carries (fixed fields, plain text only); a malformed one blames its sender."""
    try:
        record = json.loads(payload)
        fields = {k: record[k] for k in ("role", "how", "round", "kind")}
        if not all(isinstance(v, str) for k, v in fields.items() if k != "round") or \
                not (fields["round"] is None or isinstance(fields["round"], str)):
            raise TypeError
        return Blame(**fields)
    except (ValueError, KeyError, TypeError):
        return Blame(sender, "failed", None, "a malformed abort")
