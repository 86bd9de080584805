"""The cross-party links (threat_models/active_network_attacker.toml): an outsider cannot connect, read, write
or abort; an eavesdropper on a link finds no known plaintext in the bytes; the active party, which relays
frames between passive parties, can neither read nor alter them unnoticed. Each attack succeeds against a
deliberately weakened build (a clear transport, unsealed pair frames) and fails against the shipped one.
Real role processes over real sockets; the capture is a forwarding TCP proxy on the link."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from adversaries import hold

from falsevfl_secure.network import wire
from falsevfl_secure.network.channel import PairChannel
from falsevfl_secure.network.link import Hub
from falsevfl_secure.network.network import Network
from falsevfl_secure.runtime.cast import local_specs
from falsevfl_secure.runtime.role import Role
from falsevfl_secure.runtime.world import World
from falsevfl_secure.secure.errors import SecureMessageError
from falsevfl_secure.transport.protocols import protocol_named

# -- weakened and malicious builds (module-level: role processes import them by name) -----------------


class ClearHub(Hub):
    """A deliberately weakened hub: no TLS, and whoever says a pinned name is taken for it."""

    def listen(self, address, material):
        return self._server.add_insecure_port(address)

    def peer_of(self, context):
        name = dict(context.invocation_metadata()).get("falsevfl-role")
        return name if name in self.pins else None


def _clear_channel(address, material):
    import grpc

    from falsevfl_secure.network.link import _DIAL_OPTIONS

    return grpc.insecure_channel(address, options=_DIAL_OPTIONS)


class ClearNetwork(Network):
    hub_class = ClearHub
    open_channel = staticmethod(_clear_channel)


class ClearRole(Role):
    network_class = ClearNetwork


class RecordingRelay(Network):
    """The active party's hub, which keeps (and, told to, alters) the frames it relays between passive parties."""

    tamper = False

    def _relay(self, link, envelope):
        self.relayed = [*getattr(self, "relayed", []), envelope.payload]
        if self.tamper and envelope.tag == "align" and envelope.payload:
            envelope = type(envelope)(envelope.kind, envelope.src, envelope.dst, envelope.tag,
                                      bytes([envelope.payload[0] ^ 1]) + envelope.payload[1:], envelope.more)
        super()._relay(link, envelope)


class RelayRole(Role):
    network_class = RecordingRelay


class TamperingRelayRole(Role):
    class network_class(RecordingRelay):  # noqa: N801 - a class attribute named as the hook it replaces
        tamper = True


class UnsealedChannel(PairChannel):
    """A deliberately weakened pair channel: frames between passive parties cross the relay unsealed."""

    def _relayed(self, peer):
        return False


class UnsealedRole(Role):
    def channel(self, tag="align"):
        from falsevfl_secure.network.handshake import pair_keys

        keys = pair_keys(self.session, self.spec.name, self.membership.exchange, "pair-channel")
        return UnsealedChannel(self.peers, keys, tag)


# -- programs -----------------------------------------------------------------------------------------


def _sums(role, rounds: int, pause_s: float) -> list:
    """A few secure sums with pauses (time for an outsider to try its luck); the active party's totals."""
    from falsevfl_secure.secure.mpc_sum import secure_sum

    totals = []
    for i in range(rounds):
        value = torch.full((3, 4), float(role.rank + 1) + i)
        total = secure_sum(value, role.peers.active_index, role.backend.cipher.shares, role.peers)
        totals.append(None if total is None else total.numpy())
        time.sleep(pause_s)
    return totals


def _one_step(role) -> dict:
    """One stage-1 step of a small model; every party reports the latent samples it received."""
    from test_equivalence import make_job

    from falsevfl_secure.runtime.session import build_step, run_step

    job = make_job(role.peers.n_parties, "I", 6, 2, 5, 0.0, "pretrain")
    node, data = build_step(job, [role.rank], role.is_active, role.transport(torch.device("cpu")))
    run_step(node, data, job)
    latent = [e.value for e in (role.view or []) if e.kind == "received" and e.round == "latent"]
    return {"latent": latent[0] if latent else None}


def _align(role, tamper_expected: bool) -> dict:
    """The private alignment; party 1 records the pass frame that reached it from party 0 (via the relay)."""
    from falsevfl_secure.secure.align import align

    view: list = []
    ids = [f"id-{role.rank}-{i}" for i in range(30)] + [f"shared-{i}" for i in range(10)]
    try:
        align(role.channel(), ids, role.peers.active_index, view=view)
    except SecureMessageError as error:  # the tampering test reads how the receiver refused (the others abort)
        if not tamper_expected:
            raise
        return {"refused": f"{type(error).__name__}: {error}"}
    own = [e["payload"] for e in view if e["step"] == "pass1" and e["from"] == 0]
    return {"pass_from_0": np.frombuffer(own[0], dtype=np.uint8) if own else None,
            "relayed": [np.frombuffer(p, dtype=np.uint8) for p in getattr(role.network, "relayed", [])]}


def _wait_for_party0(role) -> str:
    """party0 leaves at once (cleanly, sending nothing); the active party waits for a frame from it."""
    if role.is_active:
        role.network.recv("party0", "never")
    return "left"


def _works_alone(role, units: int, allowed: int, waits: int = 1, aggregator_allowed: int | None = None) -> str:
    """The active party enters a round (progress that is not work of its own), then works alone for 6 s between
    passes, `waits` times, showing `units` units of its own work spread over each, then sends; a passive party
    waits for it each time with a 3 s limit counted from its last unit, for at most `allowed` units in all (its
    own schedule's). The he aggregator, when there is one, waits on the passive parties, which wait on the active
    party, with its own allowance (`aggregator_allowed`, else `allowed`)."""
    if not role.is_party:
        role.network.allow_work(allowed if aggregator_allowed is None else aggregator_allowed)
        return "".join(role.network.recv(name, "barrier", limit_s=3.0).decode() for name in role.peers.names[:2]
                       for _ in range(waits))
    if role.is_active:
        for _ in range(waits):
            role.network.enter("posterior")  # a round's progress: it must not count as a unit of work
            role.network.between_passes()
            for second in range(6):
                if role.network.aborted is not None:  # named already: its send below says so at once
                    break
                time.sleep(1.0)
                if second * units // 6 != (second + 1) * units // 6:
                    role.network.advanced()
            for name in role.peers.names[:role.peers.n_parties - 1]:
                role.network.send(name, "barrier", b"done")
        return "sent"
    role.network.allow_work(allowed)
    got = [role.network.recv(role.peers.names[role.peers.n_parties - 1], "barrier", limit_s=3.0) for _ in range(waits)]
    for _ in range(waits if "aggregator" in role.peers.names else 0):
        role.network.send("aggregator", "barrier", b"d")
    return got[-1].decode()


@pytest.mark.parametrize("units, allowed, waits", [(6, 6, 1), (0, 6, 1), (6, 2, 1), (3, 6, 2), (3, 4, 2)])
def test_a_wait_on_a_party_working_alone_is_bounded_from_its_last_progress(tmp_path, units, allowed, waits):
    # A cached stage 2 or the active party's tree fits run longer than RECV_TIMEOUT_S on a large table: while
    # its heartbeat shows units of its own work the wait goes on; a peer that heartbeats without them, or shows
    # more units in all than the waiting role's own schedule allows, is named. Review finding: the allowance
    # was per wait (a peer could stall every wait (units + 1) x the limit): (3, 4, 2) is named now.
    ended = _world(tmp_path, "plain", 3, _works_alone, (units, allowed, waits)).start().outcomes(60)
    if units * waits <= allowed and units:
        assert ended[0] == {"ok": "done"} and ended[1] == {"ok": "done"}, ended
    else:  # both passive parties wait: whichever gives up first names the active party (waiting on nobody, its
        # own doing; before, the waiting party failed alone, naming it only in its text) and ends the run
        said = "party2 delivered nothing (no progress in 3 s for 'barrier')"
        assert all(said in ended[k].get("error", "") for k in (0, 1, 2)), ended


def _silent_in_set_up(role) -> str:
    """Before any round: the active party waits 3 s at most for party0's set-up frame; party0 heartbeats but sends
    nothing for 8 s, waiting on nobody; party1 waits for the active party's word."""
    if role.is_active:
        return role.network.recv("party0", "barrier", limit_s=3.0).decode()
    if role.spec.name == "party0":
        hold(role, 8.0)
        role.network.send(role.peers.names[-1], "barrier", b"late")
        return "sent"
    return role.network.recv(role.peers.names[-1], "barrier", limit_s=30.0).decode()


def test_a_party_silent_in_set_up_is_named_by_the_role_waiting_on_it(tmp_path):
    # Review item: a pinned party that heartbeats but never sends a set-up step's frame held the others until the
    # set-up limit (900 s), and then the role waiting on it failed alone, as if its own failure. A linked peer that
    # waits on nobody for the whole limit is named now (one that says it waits on another still is not: the
    # aggregator's case below), and every role's error says who.
    ended = _world(tmp_path, "plain", 3, _silent_in_set_up).start().outcomes(60)
    said = "party0 delivered nothing (no progress in 3 s for 'barrier')"
    assert all(said in e.get("error", "") for e in ended), ended


def test_only_a_peers_own_work_counts_against_the_allowance_not_the_rounds_it_enters():
    # Review finding: the allowance counted every heartbeat whose round count changed, so the rounds a party
    # entered just before working alone used up units its schedule has for the work: an honest run of exactly
    # its schedule's units could be named. Heartbeats carry the units of work apart now.
    from falsevfl_secure.network.link import Link
    from falsevfl_secure.network.network import Wait, _beat_of

    assert _beat_of(b"posterior\t7\tparty2\t3") == ("posterior", 7, "party2", 3)
    assert _beat_of(b"posterior\t7\t") == ("posterior", 7, None, 0)  # no work field: none shown
    assert _beat_of(b"a\tb\tc\td\te") == (None, 0, None, 0)  # malformed: no progress of any kind
    link = Link("party2", lambda *a: None, lambda *a: None)
    wait = Wait.of({"party2": link})
    for rounds in range(1, 40):  # a peer busy in rounds shows progress, never work
        link.heard("posterior", rounds, None, 0)
    assert wait.shown("party2", link) == 0 and link.progress == 39
    link.heard(None, 40, None, 1)
    link.heard(None, 41, None, 2)
    assert wait.shown("party2", link) == 2 and link.worked_at >= wait.began
    again = Link("party2", lambda *a: None, lambda *a: None)  # a party that linked again counts from its return
    again.heard(None, 1, None, 1)
    assert wait.shown("party2", again) == 1


def test_a_peer_cannot_renew_its_progress_by_flipping_its_counts():
    # Review finding: a heartbeat whose counts went down renewed them too, so a peer that sent work 10, 11, 10,
    # 11, ... showed one unit (within any allowance) and moved its last progress forward at every beat: a wait
    # on it never ended. The counts only grow on a link now; a deadline grown by slow rounds stops at the limit.
    from falsevfl_secure.network.link import Link
    from falsevfl_secure.network.network import RECV_TIMEOUT_S, Network, Wait

    link = Link("party2", lambda *a: None, lambda *a: None)
    link.heard(None, 10, None, 10)
    wait, renewed = Wait.of({"party2": link}), None
    for beat in range(40):
        time.sleep(0.001)
        link.heard(None, 10 + beat % 2, None, 10 + beat % 2)
        renewed = renewed or (time.monotonic() if beat == 1 else None)  # the one beat that may renew: 11
    assert wait.shown("party2", link) == 1 and link.work == link.progress == 11
    # renewed once, by that beat, not 20 times (the clock read after it, not a fixed 10 ms: CI's slow machine)
    assert link.worked_at <= renewed and link.progressed_at <= renewed
    network = Network.__new__(Network)
    network.min_deadline_s, network.slowest = 45.0, 10_000.0
    assert network.deadline_s == RECV_TIMEOUT_S


@pytest.mark.parametrize("units, aggregator_allowed", [(6, 6), (6, 2), (0, 6)])
def test_the_he_aggregator_counts_the_work_of_the_party_its_peer_waits_on(tmp_path, units, aggregator_allowed):
    # Review finding: the aggregator waits on passive parties that wait on the active party working alone; they
    # show no work of their own, so it gave up after the limit however the active party progressed. It counts the
    # active party's units now, within its own allowance.
    ended = _world(tmp_path, "he", 3, _works_alone, (units, 6, 1, aggregator_allowed)).start().outcomes(60)
    if units and units <= aggregator_allowed:
        assert ended[:2] == [{"ok": "done"}, {"ok": "done"}] and ended[3] == {"ok": "dd"}, ended
    elif units:  # the passive parties' allowance holds; the aggregator's own does not
        assert "aggregator waited 3 s for 'barrier' from party0, which made no progress it could count" in \
            ended[3].get("error", ""), ended
    else:  # no work anywhere: the first role to give up names whom it waited on and ends the run
        said = [e["error"] for e in ended if "waited 3 s for 'barrier' from party" in e.get("error", "")]
        assert said and all("which made no progress it could count" in e for e in said), ended


# -- helpers ------------------------------------------------------------------------------------------


def _world(tmp_path: Path, protocol: str, parties: int, program, args=(), classes=None, via=None) -> World:
    names = [f"party{k}" for k in range(parties)]
    specs = local_specs(protocol_named(protocol), names, names[-1], tmp_path / "keys", {"command": "test"},
                        consent=True, record=True)
    return World(specs, program, args, tmp_path / "world", role_classes=classes, via=via)


def _addresses(world_dir: Path, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads((world_dir / "world.addresses").read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise AssertionError("the world wrote no address book")


class Proxy:
    """A forwarding TCP proxy that keeps every byte of both directions (the eavesdropper's capture)."""

    def __init__(self, target) -> None:
        self.target, self.captured, self._lock = target, bytearray(), threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target())
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.captured += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


# -- 1. the outsider ----------------------------------------------------------------------------------


def _try_everything(address: str, pin_of_active: bytes, tried: dict) -> None:
    """What an outsider who knows host:port and the active party's public pin can do: nothing."""
    import grpc

    from falsevfl_secure.errors import PartyFailure
    from falsevfl_secure.network.link import METHOD, dial
    from falsevfl_secure.secure import identity

    material = identity.tls_material(identity.generate(), "party0", {"party2": pin_of_active})
    try:
        dial(address, "party2", material, lambda *a: None, lambda *a: None, time.monotonic() + 2.0, me="party0")
        tried["tls with an unpinned identity"] = "connected"
    except PartyFailure as error:
        tried["tls with an unpinned identity"] = str(error)
    try:
        grpc.insecure_channel(address).stream_stream(METHOD)(iter([b"FVL1"]), timeout=3.0).next()
        tried["clear grpc"] = "answered"
    except grpc.RpcError as error:
        tried["clear grpc"] = error.code().name
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(b"\x16\x03\x01" + bytes(200) + json.dumps({"refused": "by an outsider"}).encode())
        raw.settimeout(3.0)
        try:
            tried["raw bytes"] = f"answered {len(raw.recv(4096))} bytes"
        except (TimeoutError, OSError) as error:
            tried["raw bytes"] = type(error).__name__


def test_an_outsider_cannot_connect_read_write_or_abort_and_the_run_completes(tmp_path, attacked):
    world = _world(tmp_path, "mpc", 3, _sums, (24, 0.5))
    tried: dict = {}

    def outsider() -> None:
        book = _addresses(tmp_path / "world")
        _try_everything(book["party2"], world.specs[0].cast.pins["party2"], tried)

    thread = threading.Thread(target=outsider, daemon=True)
    thread.start()
    totals = world.start().wait(120)[2]
    thread.join(30)
    assert len(tried) == 3, tried  # every attempt was made while the run was on
    attacked("outsider (no pinned identity)", "shipped", "; ".join(f"{k}: {v[:60]}" for k, v in tried.items()))
    assert "TLS handshake" in tried["tls with an unpinned identity"]
    assert tried["clear grpc"] == "UNAVAILABLE"
    raw = tried["raw bytes"]  # at most a TLS alert (7 bytes) comes back, never a frame
    assert not raw.startswith("answered") or int(raw.split()[1]) <= 7, raw
    for i, total in enumerate(totals):  # the run completed, and its sums are right
        assert np.allclose(total, np.full((3, 4), 1.0 + 2.0 + 3.0 + 3 * i))


# -- 2. the eavesdropper ------------------------------------------------------------------------------


@pytest.mark.parametrize("build", ["weakened: clear transport", "shipped"])
def test_an_eavesdropper_on_a_link_finds_no_known_plaintext(tmp_path, build, attacked):
    """Party 0's link to the active party runs through a capturing proxy during a real stage-1 step; the
    capture is searched for the float32 bytes of a latent row party 0 received, for its pinned key (in its
    hello) and for a round's name."""
    book: dict = {}
    proxy = Proxy(lambda: ("127.0.0.1", int(book.setdefault("a", _addresses(tmp_path / "world"))["party2"]
                                              .rsplit(":", 1)[1])))
    classes = dict.fromkeys(("party0", "party1", "party2"), ClearRole) if build.startswith("weakened") else None
    world = _world(tmp_path, "mpc", 3, _one_step, classes=classes, via={"party2": f"127.0.0.1:{proxy.port}"})
    reports = world.start().wait(120)
    proxy.close()
    captured = bytes(proxy.captured)
    latent = np.asarray(reports[0]["latent"], dtype="<f4")
    needles = {"a latent row": latent.reshape(-1, latent.shape[-1])[0].tobytes(),
               "the pinned key": world.specs[0].agreement.fields["parties"][0][1].encode(),
               "a round's name": b"posterior"}
    found = [name for name, needle in needles.items() if needle in captured]
    attacked("eavesdropper on a link (proxy capture)", build,
             f"{len(captured)} bytes captured; found {', '.join(found) or 'nothing'}")
    assert len(captured) > 10_000  # the step's traffic did cross the proxy
    if build.startswith("weakened"):
        assert found == list(needles)
    else:
        assert found == []


# -- 3. the relay -------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", ["weakened: unsealed pair frames", "shipped"])
def test_the_relay_cannot_read_the_frames_it_forwards_between_passive_parties(tmp_path, build, attacked):
    weak = build.startswith("weakened")
    parties = UnsealedRole if weak else Role
    classes = {"party0": parties, "party1": parties, "party2": RelayRole}
    reports = _world(tmp_path, "plain", 3, _align, (False,), classes).start().wait(120)
    plain_frame = reports[1]["pass_from_0"].tobytes()  # what party 0 sent party 1 (blinded points)
    relayed = [r.tobytes() for r in reports[2]["relayed"]]
    readable = any(plain_frame[:64] in frame for frame in relayed)
    attacked("relay reads a pair's alignment frame (active)", build,
             f"{len(relayed)} frames relayed; the blinded points {'readable' if readable else 'not readable'}")
    assert relayed and len(plain_frame) >= 64
    assert readable == weak


def test_the_relay_cannot_speak_for_a_role_that_is_not_in_the_run():
    # Review finding: a passive party took any sender name on a frame from the relay, each new name with a depth
    # and a reassembly of its own, so the hub could queue frames under "x1", "x2", ... without end. Only the
    # run's pinned roles may be relayed; anything else names the hub.
    from types import SimpleNamespace

    from falsevfl_secure.errors import ProtocolError
    from falsevfl_secure.network import wire
    from falsevfl_secure.network.network import Network, Plan, Refused

    victim = Network.__new__(Network)
    victim.me, victim.plan = "party1", Plan(relay="party2")
    victim.pins = dict.fromkeys(["party0", "party1", "party2"], b"k")
    victim.bounds, victim._rounds_declared = {}, True
    hub = SimpleNamespace(peer="party2")
    for forged in ("x1", "party1", "aggregator"):
        with pytest.raises(ProtocolError, match=f"party2 sent a frame as '{forged}'"):
            victim._deliver(hub, wire.Envelope(wire.Kind.DATA, forged, "party1", "align", b"z" * 64, True))
    with pytest.raises(Refused, match="undeclared tag"):  # a pinned role's frame goes on to its bounds
        victim._deliver(hub, wire.Envelope(wire.Kind.DATA, "party0", "party1", "align", b"z" * 64, True))


@pytest.mark.parametrize("payload", [b"[" * 5000, b'{"a":' * 5000, b"\xff\xfe{", b"{" + b"1" * 20,
                                     b"[" * 990 + b"]" * 990, b'{"a":' * 40 + b"1" + b"}" * 40])
def test_a_peers_malformed_or_deeply_nested_json_is_a_protocol_error_that_names_it(payload):
    # Review finding: json raised RecursionError on a deeply nested record, which no handler caught, so a
    # hello or an announcement a few KB deep ended the active party without naming anyone.
    from falsevfl_secure.errors import ProtocolError
    from falsevfl_secure.network.handshake import _loads, _record
    from falsevfl_secure.network.network import _blame_of, _notice_of, epoch_notice
    from falsevfl_secure.network.wire import peer_json

    with pytest.raises(ValueError):  # (990 deep loaded, then broke json.dumps a few frames deeper: review finding)
        peer_json(payload)
    assert peer_json(b'{"a": [[{"b": [1, [2, {"c": "[[[["}]]}]]}') == {"a": [[{"b": [1, [2, {"c": "[[[["}]]}]]}
    for parse in (lambda: _loads(payload, "party0", "hello", {"name"}), lambda: _record(payload, "party0")):
        with pytest.raises(ProtocolError, match="party0"):
            parse()
    for parse in (lambda: _notice_of(payload), lambda: epoch_notice(payload)):
        with pytest.raises(ProtocolError):
            parse()
    assert _blame_of(payload, "party0").role == "party0"


def test_the_set_up_steps_allowance_ends_when_the_rounds_begin():
    # Review finding: the set-up steps' allowances never ended, so any peer could keep 8 alignment frames of 256
    # MiB, 2 announcements of 256 MiB and 8 bare sums of 64 MiB waiting at any role (3.26 GiB) for the whole run,
    # the he aggregator included. Once a method's rounds are declared they are refused, naming the sender.
    import threading

    from falsevfl_secure.network import wire
    from falsevfl_secure.network.network import BEFORE_ROUNDS, SETUP, Network, Refused

    network = Network.__new__(Network)
    network._cond, network.bounds, network._rounds_declared = threading.Condition(), dict(SETUP), False
    frame = {tag: wire.Envelope(wire.Kind.DATA, "party0", "party1", tag, b"") for tag in SETUP}
    assert all(network._bound(frame[tag], "party0") == SETUP[tag] for tag in BEFORE_ROUNDS)  # during set-up
    network.allow({"posterior": 4096})
    for tag in BEFORE_ROUNDS:
        with pytest.raises(Refused, match="undeclared tag") as refused:
            network._bound(frame[tag], "party0")
        assert refused.value.offender == "party0"
    kept = [tag for tag in SETUP if tag not in BEFORE_ROUNDS]
    assert all(network._bound(frame[tag], "party0") == SETUP[tag] for tag in kept)  # losses, rejoins, resume
    assert max(SETUP[tag][0] * SETUP[tag][1] for tag in kept) <= 8 << 20


def test_a_receiver_that_stops_reading_relayed_frames_is_named_not_their_sender():
    # Review finding: the hub held the sender's stream while 8 MiB waited for a receiver that read nothing, without
    # excusing the sender, whose heartbeats then went unread: after STALL_S the hub named the honest sender.
    import threading

    from falsevfl_secure.network.link import Link
    from falsevfl_secure.network.network import RELAY_QUEUE_BYTES, Network

    hub = Network.__new__(Network)
    hub._aborted, hub.min_deadline_s, hub.slowest, hub.lost = None, 0.3, 0.0, {}
    named, excused = [], []
    hub._fault = named.append
    sender, target = (Link(name, lambda *a: None, lambda *a: None) for name in ("party0", "party1"))
    target.put([b"x" * (RELAY_QUEUE_BYTES + 1)])  # nothing of it is ever taken
    watch = threading.Thread(target=lambda: (time.sleep(0.15), excused.append(sender.held)))
    watch.start()
    began = time.monotonic()
    hub._await_drain(sender, target)
    watch.join()
    assert excused == [True] and not sender.held  # excused while held, and no longer after
    assert [(b.role, b.how) for b in named] == [("party1", "stuck")] and 0.3 <= time.monotonic() - began < 2.0


@pytest.mark.parametrize("build", ["weakened: unsealed pair frames", "shipped"])
def test_the_relay_cannot_alter_a_frame_unnoticed(tmp_path, build, attacked):
    """The relay flips one bit of a frame party 0 sends party 1: the shipped channel's AEAD refuses it, naming
    party 0 and the relay (party 1 cannot tell which of the two); unsealed, party 1 takes the altered frame as
    party 0's (whatever it then makes of the points)."""
    weak = build.startswith("weakened")
    classes = {"party2": TamperingRelayRole, **({"party0": UnsealedRole, "party1": UnsealedRole} if weak else {})}
    ended = _world(tmp_path, "plain", 3, _align, (True,), classes).start().outcomes(120)
    refused = ended[1].get("ok", {}).get("refused", "") or ended[1].get("error", "")
    attacked("relay alters a pair's alignment frame (active)", build, refused[:80] or "taken as party 0's")
    if weak:  # no integrity check: the altered frame went on to party 1's reading of party 0's points
        assert "integrity" not in refused and "frame from party 0" in refused, ended[1]
        return
    assert "failed its integrity check" in refused and "'party0' sent it so, or the relay 'party2'" in refused, refused


def test_a_peer_that_leaves_while_another_waits_for_its_frame_is_named_at_once(tmp_path):
    # Its goodbye follows its last frame on the same stream, so the waiter knows none is coming; before,
    # it waited out RECV_TIMEOUT_S (900 s), far past this test's 60 s.
    ended = _world(tmp_path, "plain", 3, _wait_for_party0).start().outcomes(60)
    assert ended[0] == {"ok": "left"}, ended[0]
    assert "party0 left (its goodbye came while party2 waited for 'never')" in ended[2].get("error", ""), ended[2]


def _stalls_with_a_story(role, story: str) -> str:
    """party0 enters the round the active party waits in and never sends its frame, for 12 s, while its heartbeat
    tells `story`: "count" (its rounds entered rise every 0.3 s) or "waiting" (it waits on party1, another passive
    party, which never sends it a round's frame). The active party's round deadline is 2 s."""
    if role.is_active:
        role.network.min_deadline_s = 2.0
        role.network.enter("posterior")
        role.network.recv("party0", "posterior")
        return "received"
    if role.spec.name == "party0":
        role.network.enter("posterior")
        for _ in range(40):
            if role.network.aborted is not None:  # named: nothing left to hold (the weakened build never names it)
                break
            if story == "count":
                role.network.enter("posterior")
            else:
                role.network.waiting_on = "party1"
            time.sleep(0.3)
        return "held"
    role.network.recv(role.peers.names[-1], "never")
    return "done"


class ExcusingNetwork(Network):
    """A weakened build: any `waiting_on` in a heartbeat excuses the peer, and every round it says it entered
    renews its deadline (the excuses before the red team's review)."""

    rounds_per_wait = 10**9

    def _waits_on_another(self, src, link) -> bool:
        return bool(link.waiting_on)


class ExcusingRole(Role):
    network_class = ExcusingNetwork


@pytest.mark.parametrize("story", ["count", "waiting"])
@pytest.mark.parametrize("build", ["weakened: its word excuses it", "shipped"])
def test_a_stalled_party_is_named_whatever_its_heartbeat_claims(tmp_path, attacked, story, build):
    # Red team: a passive party that held its frame back while its heartbeat's round count rose, or while it said
    # it waited on another passive party, was never named (only the 900 s limit would have ended the wait). A
    # peer's count now renews a wait for at most ROUNDS_PER_WAIT rounds, and only a claim to wait on a role that
    # may send it a round's frame excuses it.
    began = time.monotonic()
    weak, ended, said = _stall_attack(tmp_path, _stalls_with_a_story, story, build, ExcusingRole, attacked,
                                      f"a stalled party whose heartbeat claims {story}")
    if weak:  # it went on until party0 chose to leave
        assert "party0 left" in said and "delivered nothing" not in said, ended
        return
    assert "party0 delivered nothing (none for 2 s) while its heartbeat went on in round 'posterior'" in said, ended
    assert time.monotonic() - began < 40


def _claims_past_the_limit(role, story: str) -> str:
    """In a round whose deadline (30 s) is past the wait's limit (3 s): party0 holds its frame while its heartbeat
    claims to wait on `story` (another passive party, the waiter itself, a name no role has)."""
    if role.is_active:
        role.network.min_deadline_s = 30.0
        role.network.enter("posterior")
        return role.network.recv("party0", "posterior", limit_s=3.0).decode()
    if role.spec.name == "party0":
        role.network.enter("posterior")
        for _ in range(40):
            if role.network.aborted is not None:
                break
            role.network.waiting_on = story
            time.sleep(0.3)
        return "held"
    return role.network.recv(role.peers.names[-1], "never", limit_s=40.0).decode()


class ClaimBelievingNetwork(Network):
    """A weakened build: at a wait's limit any claim to wait on someone has this role fail alone (a review found
    it so: the red team's fix above undone where the limit comes before the round's deadline)."""

    def _may_wait_in_turn(self, src, link) -> bool:
        return link is None or bool(link.waiting_on)


class ClaimBelievingRole(Role):
    network_class = ClaimBelievingNetwork


@pytest.mark.parametrize("build", ["weakened: any claim believed at the limit", "shipped"])
@pytest.mark.parametrize("story", ["party1", "party2", "nobody-of-this-run"])
def test_a_claim_to_wait_does_not_spare_a_stalled_party_at_the_waits_limit(tmp_path, attacked, story, build):
    weak, ended, said = _stall_attack(tmp_path, _claims_past_the_limit, story, build, ClaimBelievingRole, attacked,
                                      f"a stalled party claiming to wait on {story} past the limit")
    if weak:  # the honest active party failed in its place
        assert "party2 waited 3 s for 'posterior' from party0" in said and "party0 delivered" not in said, ended
        return
    assert all("party0 delivered nothing (no progress in 3 s for 'posterior')" in e.get("error", "")
               for e in ended[1:]), ended  # (party0 itself held on to the end of its program)


def _stall_attack(tmp_path, program, story: str, build: str, weakened, attacked, what: str) -> tuple:
    """Run `program` with party0 stalling as `story` says, the active party of the `weakened` class unless the
    build is shipped; (weak, every role's outcome, the active party's error), the attack reported."""
    weak = build != "shipped"
    ended = _world(tmp_path, "plain", 3, program, (story,), {"party2": weakened} if weak else None).start().outcomes(60)
    said = ended[2].get("error", "")
    attacked(what, build, said[:90])
    return weak, ended, said


def test_a_heartbeat_flood_is_refused_naming_its_sender():
    # Red team: 3 million valid heartbeats in 3 minutes took most of a core at the active party and slowed its
    # training a hundredfold, naming nobody. A link accepts twice its period's beats plus a burst.
    from falsevfl_secure.network.link import BEAT_SLACK, Link
    from falsevfl_secure.network.network import HEARTBEAT_S, Network

    link = Link("party0", lambda *a: None, lambda *a: None)
    assert all(link.beat_within(HEARTBEAT_S) for _ in range(BEAT_SLACK))  # a burst queued behind a long frame
    assert not link.beat_within(HEARTBEAT_S)
    slow = Link("party1", lambda *a: None, lambda *a: None)
    slow.opened -= 100 * HEARTBEAT_S  # a link open for 100 periods took 100 beats: within
    assert all(slow.beat_within(HEARTBEAT_S) for _ in range(100 + BEAT_SLACK))
    network = Network.__new__(Network)
    network._dismissed, network._aborted, network._cond = set(), None, threading.Condition()
    named = []
    network._abort = lambda blame, **_: named.append(blame)
    network.links, network.round, network.me = {}, None, "party2"
    beat = wire.Envelope(wire.Kind.HEARTBEAT, "party0", "", "", b"posterior\t1\t\t0")
    network._arrived(link, beat)
    assert [(b.role, b.how) for b in named] == [("party0", "refused")] and "heartbeats" in named[0].kind


def test_a_message_of_the_wrong_size_is_its_senders_refusal():
    # Review finding: a plain broadcast of the wrong size ended the run as the receiver's own error, so every other
    # role named the receiver; a sum's message of the wrong size already named its sender (red team).
    from types import SimpleNamespace

    from falsevfl_secure.network.wire import Refused
    from falsevfl_secure.transport.rounds import POSTERIOR
    from falsevfl_secure.transport.sums import SumBackend, recv_float32

    peers = SimpleNamespace(names=["party0", "party1", "party2"], recv=lambda src, tag: bytes(12), n_parties=3,
                            rank=1, active_index=0, is_active=False, alive=[0, 1, 2])
    with pytest.raises(Refused, match="party0 sent 12 bytes") as refused:
        recv_float32(peers, 0, "latent", (2, 2))
    assert refused.value.offender == "party0"
    assert recv_float32(peers, 0, "latent", (3,)).shape == (3,)  # the declared size is taken
    cipher = SimpleNamespace(protection="mpc", combined_by=None, message_bytes=lambda round, numel: 8 * numel)
    backend = SumBackend(replace_peers(peers, rank=0, is_active=True), cipher)
    with pytest.raises(Refused, match="party2 sent 12 bytes") as refused:
        backend._receive(POSTERIOR, 2, (4,))
    assert refused.value.offender == "party2"


def replace_peers(peers, **changes):
    from types import SimpleNamespace

    return SimpleNamespace(**{**vars(peers), **changes})


def test_an_odd_set_up_answer_is_its_senders_refusal():
    # Review finding: a passive party's budget verdict that is neither 0 nor 1 (or a training run that is no session
    # id) ended the run as the active party's own ProtocolError, so every other role named the active party.
    from types import SimpleNamespace

    from falsevfl_secure.federation.party import _budgets_agree, _same_training
    from falsevfl_secure.network.wire import Refused

    sent = {"party1": b"\x01", "party2": b"\x07"}
    peers = SimpleNamespace(names=["party0", "party1", "party2"], n_parties=3, active_index=0,
                            recv=lambda k, tag: sent[["party0", "party1", "party2"][k]], send=lambda *a: None)
    role = SimpleNamespace(peers=peers, spec=SimpleNamespace(name="party0"), is_active=True)
    with pytest.raises(Refused, match="party2 sent a budget verdict") as refused:
        _budgets_agree(role, None)
    assert refused.value.offender == "party2"
    sent["party2"] = b"\x01"
    _budgets_agree(role, None)  # every verdict 1: the run goes on
    sent["party1"] = b"\x00" * 5  # a training run that is neither empty nor a 32-byte session id
    with pytest.raises(Refused, match="party1 named a training run") as refused:
        _same_training(role, SimpleNamespace(trained_in=None), Path("."))
    assert refused.value.offender == "party1"


def test_a_party_that_is_not_listening_is_said_to_be_so():
    # A trial's passive party waited its join_timeout_s and then printed the library's "Failed to connect to remote
    # host: Connection refused" alone; a closed port now reads as what it means for the run.
    import grpc

    from falsevfl_secure.network.link import _why_not_ready

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        assert _why_not_ready(channel).startswith("nothing listens there (connection refused)")
    finally:
        channel.close()


def test_an_error_every_party_found_is_reported_as_theirs_not_the_first_ones():
    # A trial's IDs did not line up: every party stopped with the same text, and the launcher's line began "family
    # failed", as if family were at fault.
    from falsevfl_secure.runtime.world import describe

    names = ["insurer", "school", "family", "aggregator"]
    text = "training stopped: party 'school' and the active party 'insurer' both list 0 records"
    reports = {r: {"outcome": "error", "at": 3.0 - r, "error": text} for r in range(3)}
    reports[3] = {"ok": None}
    assert describe(names, reports, {}) == f"insurer, school, family each failed while no round was running (set-up, " \
                                           f"alignment or shut-down): {text}"
    reports[3] = {"outcome": "error", "at": 9.0, "error": text}
    assert describe(names, reports, {}).startswith("every role failed")
    reports[1]["error"] = reports[2]["error"] = "its own table is unreadable"
    assert describe(names, reports, {}).startswith("school, family each failed")  # family's came first
    reports[1]["error"] = "another error"
    assert describe(names, reports, {}).startswith("family failed")
