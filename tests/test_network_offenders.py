"""A misbehaving peer is named, never an honest one (review findings on the network's bounds): a hub relays only
between the roles it is the relay of, and refuses a sender that interleaves frames through it; a peer's numbers
and texts too large or malformed to parse are refused naming it; an abort's and a heartbeat's texts are plain and
short; a receiver whose heartbeat counts up while it reads nothing is named; a step is taken only from the roles
that send it, and one still waiting when it is over is dropped; a peer that reads nothing holds its sender and is
named; the he aggregator names the passive party whose message it refuses. Each test drives a `Network` (or the
aggregator's loop over one) directly with stand-in links (no sockets) and says what the code before the fix did."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from types import SimpleNamespace

import pytest

from falsevfl_secure.errors import ProtocolError
from falsevfl_secure.network import wire
from falsevfl_secure.network.link import Link
from falsevfl_secure.network.network import RELAY_QUEUE_BYTES, TEXT_CHARS, Blame, Network, Plan

PINS = dict.fromkeys(("active", "X", "Y", "aggregator"), b"\0" * 32)
PASSIVE = Plan(dial=(("active", ""), ("aggregator", "")), relay="active")


def hub(me: str, accept: tuple[str, ...], *peers: str) -> tuple[Network, dict[str, Link]]:
    """A role whose hub serves `accept`, linked to `peers` by stand-in links (nothing is sent anywhere)."""
    network = Network(me, None, PINS, Plan(serve_at="stand-in", accept=accept))
    network._hub = object()  # (only whether it serves matters here)
    links = {peer: Link(peer, network._arrived, network._link_closed) for peer in peers}
    network.links.update(links)
    return network, links


def passive(me: str, *peers: str) -> tuple[Network, dict[str, Link]]:
    network = Network(me, None, PINS, PASSIVE)
    links = {peer: Link(peer, network._arrived, network._link_closed) for peer in peers}
    network.links.update(links)
    return network, links


def sent(link: Link) -> list[wire.Envelope]:
    """Every envelope queued on a stand-in link (taken off it)."""
    out = []
    while not link._outbound.empty():
        out.append(wire.decode(link._outbound.get()))
    return out


def data(envelopes: list[wire.Envelope]) -> list[wire.Envelope]:
    return [e for e in envelopes if e.kind is wire.Kind.DATA]


def frame(src: str, dst: str, tag: str, payload: bytes = b"", more: bool = False) -> wire.Envelope:
    return wire.Envelope(wire.Kind.DATA, src, dst, tag, payload, more)


# -- 1. only the plan's relay relays ----------------------------------------------------------------------


def test_the_he_aggregators_hub_relays_nothing_and_names_the_sender_that_asked_it_to():
    # Before: any hub forwarded a frame to any role linked to it, so the aggregator passed X's frame on to Y, and
    # Y, which takes relayed frames only from its relay (the active party), named the honest aggregator.
    aggregator, links = hub("aggregator", ("active", "X", "Y"), "active", "X", "Y")
    aggregator._arrived(links["X"], frame("X", "Y", "barrier"))
    assert data(sent(links["Y"])) == []
    assert (aggregator.aborted.role, aggregator.aborted.how) == ("X", "refused")


def test_the_set_up_makes_the_active_partys_hub_the_relay_of_the_passive_parties_only():
    # Before: every hub forwarded a frame to any role linked to it: the active party passed X's frame on to the
    # aggregator (which it dials), and the aggregator, which takes no relayed frame, named the honest active party.
    from falsevfl_secure.network.handshake import Cast, Handshake, Request

    class Linked(Exception):
        pass

    active, links = hub("active", ("X", "Y"), "X", "Y", "aggregator")
    active.wait_for = lambda *a: (_ for _ in ()).throw(Linked())  # the set-up stops once the hellos are awaited
    cast = Cast(("active", "X", "Y"), "active", "aggregator", PINS)
    with pytest.raises(Linked):
        Handshake(active, "active", None, None, cast, Request(cast.parties, False, 1.0)).lead()
    active._arrived(links["X"], frame("X", "Y", "barrier"))
    assert [(e.src, e.dst, e.tag) for e in data(sent(links["Y"]))] == [("X", "Y", "barrier")] and not active.aborted
    active._arrived(links["X"], frame("X", "aggregator", "barrier"))
    assert data(sent(links["aggregator"])) == []
    assert (active.aborted.role, active.aborted.how) == ("X", "refused")


# -- 2. a sender that interleaves frames through the relay -------------------------------------------------


def test_a_sender_that_interleaves_frames_through_the_relay_is_named_not_the_relay():
    # Before: the hub forwarded X's 'keys' fragment into the middle of its 'align' frame, and Y, which joins a
    # frame per sender, raised a ProtocolError that it pinned on the link's peer: the honest active party.
    active, links = hub("active", ("X", "Y"), "X", "Y")
    active.relay_for(("X", "Y"))
    active._arrived(links["X"], frame("X", "Y", "align", b"a" * 10, more=True))
    active._arrived(links["X"], frame("X", "Y", "keys", b"k" * 10))
    assert (active.aborted.role, active.aborted.how) == ("X", "refused")
    forwarded = sent(links["Y"])
    assert [e.tag for e in data(forwarded)] == ["align"]  # the interleaved fragment never left the hub

    y, y_links = passive("Y", "active")
    for envelope in forwarded:
        y._arrived(y_links["active"], envelope)
    assert y.aborted.role == "X" and y.aborted.by == "active"


# -- 3. numbers too large to parse ------------------------------------------------------------------------


def test_a_heartbeat_count_of_thousands_of_digits_is_refused_naming_its_sender():
    # Before: int() of more than 4300 digits raised a ValueError, which the link reader took for a closed link:
    # X was reported as having left, not as refused.
    network, links = hub("active", ("X",), "X")
    beat = wire.encode(wire.Envelope(wire.Kind.HEARTBEAT, "X", "", "", b"r\t" + b"9" * 5000 + b"\t\t0"))
    links["X"].read(iter([beat]))
    assert (network.aborted.role, network.aborted.how) == ("X", "refused")


@pytest.mark.parametrize("payload", [b'{"lost":[],"stage":Infinity,"epoch":0,"index":0}',
                                     b'{"stage":1e999,"epoch":0,"version":0,"joined":[]}'])
def test_an_announcement_with_an_infinite_number_is_a_protocol_error(payload):
    # Before: int(inf) raised an OverflowError, which no handler caught (the link reader took it for a leave).
    from falsevfl_secure.network.network import _notice_of, epoch_notice

    for parse in (_notice_of, epoch_notice):
        with pytest.raises(ProtocolError):
            parse(payload)


def test_a_loss_announced_for_a_role_not_in_the_run_names_the_active_party():
    # Before: the notice was taken, and sums.py's names.index(...) raised a ValueError at the aggregator.
    from falsevfl_secure.transport.sums import _after_loss

    y, links = passive("Y", "active")
    y.coordinator = "active"
    y._arrived(links["active"], frame("active", "Y", "lost", b'{"lost":["Z"],"stage":1,"epoch":0,"index":0}'))
    assert (y.aborted.role, y.aborted.how) == ("active", "failed")

    notice = {"lost": ["Z"], "stage": 1, "epoch": 0, "index": 0, "plan": 0}  # (a name another role's pins hold)
    peers = SimpleNamespace(names=("active", "X", "aggregator"), n_parties=2, active_index=0,
                            network=SimpleNamespace(take_notice=lambda: notice))
    with pytest.raises(ProtocolError, match="active"):
        _after_loss(peers, [1])


def test_the_bounds_of_the_sums_with_an_infinite_number_are_a_protocol_error():
    # Before: int(inf) raised an OverflowError out of the aggregator's loop, naming nobody.
    from falsevfl_secure.transport.sums import _bounded

    peers = SimpleNamespace(names=("active", "X", "aggregator"), active_index=0,
                            recv=lambda k, tag: b'{"model_sum": Infinity}')
    with pytest.raises(ProtocolError, match="active"):
        _bounded(peers, SimpleNamespace(wire_bytes=lambda round, n: n))


def test_a_set_up_record_with_a_number_of_thousands_of_digits_is_a_protocol_error_naming_its_sender():
    # Before: _loads caught only JSONDecodeError, and read_signed did not catch at all: int() of more than 4300
    # digits (or a signed body that is no JSON) raised a bare ValueError, not the protocol error that names it.
    from falsevfl_secure.network.handshake import Cast, Handshake, _dumps, _loads
    from falsevfl_secure.secure.identity import generate, public_bytes, sign

    with pytest.raises(ProtocolError, match="X"):
        _loads(b'{"name": ' + b"9" * 5000 + b"}", "X", "hello", {"name"})
    key = generate()
    cast = Cast(("active", "X"), "active", None, {**PINS, "active": public_bytes(key)})
    for body in (b"9" * 5000, b"{"):
        signed = _dumps({"roster": body.decode(), "signature": sign(key, "roster", body).hex()})
        with pytest.raises(ProtocolError, match="active"):
            Handshake(None, "X", None, None, cast, None).read_signed(signed, "roster", {"present"})


# -- 4. the texts of an abort and of a heartbeat ----------------------------------------------------------


@pytest.mark.parametrize("field, value", [("role", "nobody"), ("how", "\x1b[2Jexploded"), ("round", "r" * 300),
                                          ("round", "posterior\x1b]0;owned\x07"), ("kind", "k" * (256 << 10))])
def test_an_abort_whose_texts_are_not_plain_and_short_blames_its_sender(field, value):
    # Before: any role, how, round and kind (up to a message's 256 KiB, control characters included) were
    # believed, printed in every role's error line and flooded on to every peer.
    network, links = hub("active", ("X",), "X")
    blame = {"role": "Y", "how": "stalled", "round": "posterior", "kind": "", **{field: value}}
    network._arrived(links["X"], wire.Envelope(wire.Kind.ABORT, "X", "", "", json.dumps(blame).encode()))
    assert network.aborted == Blame("X", "failed", None, "a malformed abort", by="X")


def test_an_honest_abort_with_a_long_refusal_is_believed_cut_to_plain_text():
    # The sender cuts its texts to what a peer accepts (its full refusal stays in its own error line).
    sender, _ = hub("active", ("X",))
    told = wire.decode(sender._abort_frame(Blame("Y", "refused", "posterior", "more than 2 frames 'posterior'"
                                                 " ahead (relayed by active, which could have sent them) \x1b")))
    network, links = hub("X", ("active",), "active")
    network._arrived(links["active"], told)
    assert (network.aborted.role, network.aborted.how, network.aborted.by) == ("Y", "refused", "active")
    assert len(network.aborted.kind) == TEXT_CHARS and network.aborted.kind.isprintable()


@pytest.mark.parametrize("state", [b"r" * 300 + b"\t1\t\t0", b"posterior\x1b[2J\t1\t\t0", b"posterior\t1\tX\x07\t0"])
def test_a_heartbeat_whose_texts_are_not_plain_and_short_is_refused_naming_its_sender(state):
    # Before: its round (up to 256 KiB, control characters included) was kept as the peer's round and printed
    # in every blame that named it.
    network, links = hub("active", ("X",), "X")
    network._arrived(links["X"], wire.Envelope(wire.Kind.HEARTBEAT, "X", "", "", state))
    assert (network.aborted.role, network.aborted.how) == ("X", "refused") and links["X"].last_round is None


# -- 5. a receiver that reads nothing while its heartbeat counts up ----------------------------------------


def test_a_receiver_whose_heartbeat_counts_up_while_it_reads_nothing_is_named_within_two_deadlines():
    # Before: its heartbeat's progress counter excused it on every beat, so the hub held the sender's stream
    # (and the run) for as long as the receiver kept beating.
    active, links = hub("active", ("X", "Y"), "X", "Y")
    active.min_deadline_s = 0.3  # deadline_s = 0.3 s (45 s by default)
    links["Y"].put([b"\0" * (RELAY_QUEUE_BYTES + 1)])  # Y takes none of it
    stop = threading.Event()

    def lying_heartbeats() -> None:
        beat = 0
        while not stop.wait(0.05):
            beat += 1
            links["Y"].heard("embedding", beat, None)

    threading.Thread(target=lying_heartbeats, daemon=True).start()
    began, holding = time.monotonic(), threading.Thread(target=active._await_drain, args=(links["X"], links["Y"]),
                                                        daemon=True)
    holding.start()
    holding.join(3.0)
    held_for, still_held = time.monotonic() - began, holding.is_alive()
    stop.set()
    holding.join(2.0)
    assert not still_held and held_for < 2.0 and not links["X"].held
    assert (active.aborted.role, active.aborted.how) == ("Y", "stuck")


# -- 6. who may send each set-up step, and frames of a step that is over ------------------------------------


def deliver(network: Network, link: Link, src: str, tag: str, payload: bytes = b"") -> None:
    """A whole frame from `src` arriving on `link` (in fragments, as a link hands them over)."""
    for part in wire.fragments(wire.Kind.DATA, src, network.me, tag, payload):
        network._arrived(link, wire.decode(part))


@pytest.mark.parametrize("tag", ["sum", "context", "kept", "roster", "rejoin", "align", "bounds"])
def test_a_set_up_step_from_the_aggregator_is_refused_at_a_passive_party_naming_the_aggregator(tag):
    # Before: every set-up tag was taken from any sender and parked unread (a passive party never reads from the
    # aggregator): 8 'sum' and 2 'context' frames of 64 MiB each, ... about 1 GiB per passive party, nobody named.
    y, links = passive("Y", "active", "aggregator")
    deliver(y, links["aggregator"], "aggregator", tag, b"\0" * 1000)
    assert (y.aborted.role, y.aborted.how) == ("aggregator", "refused") and not y._mail["aggregator"]


@pytest.mark.parametrize("tag", ["context", "kept", "roster", "lost", "epoch", "pass-done", "posterior"])
def test_a_step_of_the_active_partys_relayed_from_another_passive_party_is_refused_naming_that_party(tag):
    # Before: X could park, through the relay, every step only the active party sends (and a round's first frames)
    # at Y for the whole run.
    y, links = passive("Y", "active")
    deliver(y, links["active"], "X", tag, b"{}")
    assert (y.aborted.role, y.aborted.how, y._mail["X"]) == ("X", "refused", deque())


def test_a_round_frame_from_the_aggregator_to_a_passive_party_is_refused_naming_the_aggregator():
    # Before: once the rounds were declared, the aggregator could keep 2 frames of each round waiting at a passive
    # party, which takes rounds from the active party only.
    y, links = passive("Y", "active", "aggregator")
    y.allow({"posterior": 1 << 20, "latent": 1 << 20})
    deliver(y, links["active"], "active", "latent", b"\0" * 16)  # the active party's broadcast: taken
    deliver(y, links["aggregator"], "aggregator", "posterior", b"\0" * 16)
    assert (y.aborted.role, y.aborted.how) == ("aggregator", "refused")
    assert [tag for tag, _ in y._mail["active"]] == ["latent"] and not y._mail["aggregator"]


def test_the_shipped_steps_are_taken_from_the_roles_that_send_them():
    # (Not a finding: every step a shipped path or a test session sends stays accepted where it goes.)
    y, y_links = passive("Y", "active", "aggregator")
    for src, link, tag in [("active", "active", "roster"), ("active", "active", "context"), ("X", "active", "align"),
                           ("active", "active", "kept"), ("X", "active", "sum"), ("active", "active", "lost")]:
        deliver(y, y_links[link], src, tag, b"{}")
    aggregator, a_links = hub("aggregator", ("active", "X", "Y"), "active", "X", "Y")
    aggregator.coordinator = "active"
    for src, tag in [("active", "roster"), ("active", "bounds"), ("X", "stop"), ("Y", "lost-ack"), ("X", "barrier")]:
        deliver(aggregator, a_links[src], src, tag, b"{}")
    active, p_links = hub("active", ("X", "Y"), "X", "Y")
    active.coordinator = "active"
    for src, tag in [("X", "hello"), ("X", "align"), ("Y", "model"), ("Y", "resume")]:
        deliver(active, p_links[src], src, tag, b"{}")
    for src, tag in [("active", "keys"), ("active", "rejoin"), ("active", "pass-done"), ("active", "epoch")]:
        deliver(y, y_links["active"], src, tag, b"{}")
    notice = json.dumps({"lost": ["X"], "stage": 1, "epoch": 0, "index": 1, "plan": 1}).encode()
    for src, tag, payload in [("active", "epoch", b"{}"), ("active", "lost", notice)]:
        deliver(aggregator, a_links[src], src, tag, payload)
    for src, tag in [("X", "keys"), ("X", "lost-ack")]:
        deliver(active, p_links[src], src, tag, b"{}")
    roles = [y, aggregator, active]
    # the aggregator's answers to the active party, and every round's frames where they go, once declared
    helped, h_links = passive("active", "aggregator")
    helped.plan = Plan(dial=(("aggregator", "stand-in"),))
    for tag in ("epoch-ack", "bounds-ack", "lost-ack"):
        deliver(helped, h_links["aggregator"], "aggregator", tag, b"{}")
    rounds = [passive("Y", "active", "aggregator"), hub("aggregator", ("active", "X", "Y"), "active", "X", "Y"),
              hub("active", ("X", "Y"), "X", "Y"), passive("active", "aggregator")]  # (set-up frames read by then)
    rounds[1][0].coordinator, rounds[2][0].coordinator = "active", "active"
    rounds[3][0].plan = Plan(dial=(("aggregator", "stand-in"),))
    for (network, links), src in zip(rounds, ("active", "X", "X", "aggregator"), strict=True):
        network.allow({"posterior": 1 << 10})
        deliver(network, links[src], src, "posterior", b"{}")
    assert [r.aborted for r in [*roles, helped, *(n for n, _ in rounds)]] == [None] * 8


def test_a_frame_of_a_set_up_step_still_waiting_when_the_rounds_are_declared_is_dropped_naming_its_sender():
    # Before: `allow` refused later frames of the alignment's steps but kept those already waiting (8 of 256 MiB
    # per sender) for the whole run.
    active, links = hub("active", ("X", "Y"), "X", "Y")
    active.coordinator = "active"
    deliver(active, links["X"], "X", "align", b"\0" * 1000)  # one more than its alignment's step sends
    deliver(active, links["Y"], "Y", "resume", b"\0" * 8)  # a step that is not over: kept
    active.allow({"posterior": 4096})
    assert (active.aborted.role, active.aborted.how) == ("X", "refused")
    assert not active._mail["X"] and active._queued["X", "align"] == 0 and len(active._mail["Y"]) == 1


def test_the_aggregator_drops_what_a_passive_party_sent_as_the_active_party_once_the_set_up_names_it():
    # Before: the aggregator's hub took any set-up step from any party and kept it; until the set-up names the
    # active party it cannot tell which client that is, so it checks what waits once it knows.
    aggregator, links = hub("aggregator", ("active", "X", "Y"), "active", "X", "Y")
    deliver(aggregator, links["active"], "active", "roster", b"{}")
    deliver(aggregator, links["X"], "X", "bounds", b"{}")  # only the active party declares the sums' bounds
    assert aggregator.aborted is None
    aggregator.coordinator = "active"
    assert (aggregator.aborted.role, aggregator.aborted.how) == ("X", "refused")
    assert not aggregator._mail["X"] and len(aggregator._mail["active"]) == 1


# -- 7. a peer that stops reading what this role sends it -------------------------------------------------


def test_a_peer_that_reads_nothing_holds_the_sender_and_is_named_instead_of_growing_its_queue():
    # Before: `send` queued every frame and returned: a party that stopped reading its stream made the active
    # party's broadcasts pile up in its memory (40 MiB here, without end in a run), and nobody was named.
    from falsevfl_secure.network.network import RunAborted

    active, links = hub("active", ("X", "Y"), "X", "Y")
    active.min_deadline_s = 0.3  # deadline_s = 0.3 s (45 s by default)
    active.allow({"latent": 1 << 20})
    began = time.monotonic()
    with pytest.raises(RunAborted):
        for _ in range(40):
            active.send("X", "latent", bytes(1 << 20))
    assert time.monotonic() - began < 2.0 and links["X"].queued <= RELAY_QUEUE_BYTES + (2 << 20)
    assert (active.aborted.role, active.aborted.how) == ("X", "stuck")


def test_while_a_peer_reads_nothing_the_senders_heartbeats_say_it_waits_on_that_peer():
    # Review finding: the active party held in `send` still beat "waiting on nobody", so a third party waiting
    # on it named the honest active party as stuck before it named the peer that read nothing; and that peer's own
    # heartbeats (progress counting up) bought it a second deadline.
    active, links = hub("active", ("X", "Y"), "X", "Y")
    active.min_deadline_s = 0.6
    active.allow({"latent": 1 << 20})
    links["X"].heard("latent", 1, "", 1)  # X beats with progress, and reads nothing
    seen, done = set(), threading.Event()

    def watch():  # what the active party's heartbeats would carry meanwhile
        while not done.is_set():
            seen.add(active.waiting_on)
            links["X"].heard("latent", 2 + len(seen), "", 2 + len(seen))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    from falsevfl_secure.network.network import RunAborted

    began = time.monotonic()
    try:
        with pytest.raises(RunAborted):
            for _ in range(40):
                active.send("X", "latent", bytes(1 << 20))
    finally:
        done.set()
        watcher.join()
    assert "X" in seen and active.waiting_on is None
    assert (active.aborted.role, active.aborted.how) == ("X", "stuck") and time.monotonic() - began < 1.2


# -- 8. the he aggregator names the passive party whose message it refuses ----------------------------------


@pytest.fixture(scope="module")
def he():
    """Every party's CKKS cipher (the active party's holds the secret) and the aggregator's, one context."""
    from falsevfl_secure.transport.ciphers.he import He

    return He().in_process(3)


def posterior(cipher, value) -> bytes:
    from falsevfl_secure.transport.rounds import POSTERIOR

    return cipher.protect(POSTERIOR, value, 3)[0]


def combine_at_aggregator(helper, sent: dict[str, list[tuple[str, bytes]]], heard: tuple = (),
                          told: tuple[tuple[str, bytes], ...] = ()) -> tuple[Network, dict[str, Link]]:
    """The aggregator's loop (`serve_combiner`, ranks: active, X, Y, aggregator) over the active party's bounds (and
    frames `told`) and each passive party's frames `sent`, all arrived already (and the active party's heartbeat
    `heard`); it returns once both said stop."""
    from falsevfl_secure.network.peers import Peers
    from falsevfl_secure.secure import frames
    from falsevfl_secure.transport.sums import serve_combiner

    aggregator, links = hub("aggregator", ("active", "X", "Y"), "active", "X", "Y")
    aggregator.coordinator = "active"
    aggregator.allow({"posterior": 1 << 20, "likelihood": 1 << 20})  # (as the bounds below declare them)
    deliver(aggregator, links["active"], "active", "bounds", json.dumps({"posterior": 12, "likelihood": 12}).encode())
    for tag, payload in told:
        deliver(aggregator, links["active"], "active", tag, payload)
    for name, frames_sent in sent.items():
        for tag, payload in [*frames_sent, ("stop", frames.encode(frames.Kind.STOP))]:
            deliver(aggregator, links[name], name, tag, payload)
    if heard:
        links["active"].heard(*heard)
    serve_combiner(Peers(aggregator, ("active", "X", "Y", "aggregator"), 3, 3, 0), helper)
    return aggregator, links


def forwarded(link: Link, tag: str) -> bytes:
    return b"".join(e.payload for e in data(sent(link)) if e.tag == tag)


@pytest.mark.parametrize("bad", ["no frame", "another round's frame", "a tampered ciphertext"])
def test_the_aggregator_names_the_passive_party_whose_message_it_refuses(he, bad):
    # Before: frames.decode, the round check or sum_encrypted ("contribution 1: ...") raised out of the
    # aggregator's loop as its own failure: the run ended naming the honest aggregator.
    import torch

    from falsevfl_secure.network.network import RunAborted
    from falsevfl_secure.secure import frames
    from falsevfl_secure.transport.rounds import LIKELIHOOD

    (_, x, y), helper = he
    good = frames.decode(posterior(x, torch.ones(3, 4))).blobs[0]
    tampered = good[:-1] + bytes([good[-1] ^ 1])
    message = {"no frame": b"junk" * 8, "a tampered ciphertext": frames.encode(frames.Kind.DATA, [tampered], 0),
               "another round's frame": frames.encode(frames.Kind.DATA, [good], LIKELIHOOD.index)}[bad]
    with pytest.raises(RunAborted) as ended:
        combine_at_aggregator(helper, {"X": [("posterior", message)],
                                       "Y": [("posterior", posterior(y, torch.ones(3, 4)))]})
    assert (ended.value.blame.role, ended.value.blame.how) == ("X", "refused")


def test_the_aggregator_forwards_its_own_word_naming_the_party_that_refused_never_that_partys_text(he):
    # Before: X's ERROR frame went on to the active party unchanged, and the active party raised X's text (any
    # text, control characters included) as its own SecureRangeError: X could write "party2 refused ..." there.
    import torch

    from falsevfl_secure.secure import frames
    from falsevfl_secure.secure.errors import SecureRangeError
    from falsevfl_secure.transport.rounds import POSTERIOR

    (active, _, y), helper = he
    lie = frames.encode(frames.Kind.ERROR, [b"Y refused its own input \x1b[2J" * 100], POSTERIOR.index)
    _, links = combine_at_aggregator(helper, {"X": [("posterior", lie)],
                                              "Y": [("posterior", posterior(y, torch.ones(3, 4)))]})
    with pytest.raises(SecureRangeError) as refused:
        active.reveal(POSTERIOR, forwarded(links["active"], "posterior"), (3, 4), None)
    said = str(refused.value)
    assert "X refused its own input" in said and "Y refused" not in said and said.isprintable() and len(said) < 400


def test_messages_of_different_numbers_of_values_are_judged_by_the_active_party_which_names_the_odd_one(he):
    # Before: sum_encrypted raised "contribution 1 holds 6 values, the first holds 12" out of the aggregator's
    # loop, which cannot tell whose number is wrong: the run ended naming the honest aggregator.
    import torch

    from falsevfl_secure.network.network import RunAborted
    from falsevfl_secure.network.peers import Peers
    from falsevfl_secure.transport.rounds import POSTERIOR
    from falsevfl_secure.transport.sums import SumBackend

    (active_cipher, x, y), helper = he
    _, links = combine_at_aggregator(helper, {"X": [("posterior", posterior(x, torch.ones(3, 4)))],
                                              "Y": [("posterior", posterior(y, torch.ones(6)))]})
    active = Network("active", None, PINS, Plan(serve_at="stand-in", accept=("X", "Y"), dial=(("aggregator", ""),)))
    active.links.update({p: Link(p, active._arrived, active._link_closed) for p in ("X", "Y", "aggregator")})
    deliver(active, active.links["aggregator"], "aggregator", "posterior", forwarded(links["active"], "posterior"))
    backend = SumBackend(Peers(active, ("active", "X", "Y", "aggregator"), 0, 3, 0), active_cipher)
    with pytest.raises(RunAborted):
        backend.sum_to_active(POSTERIOR, torch.zeros(3, 4))
    assert (active.aborted.role, active.aborted.how, active.aborted.by) == ("Y", "refused", "aggregator")


def test_a_party_out_of_step_is_named_by_the_round_the_active_party_waits_on_the_aggregator_in(he):
    # Before: two passive parties that sent different rounds made the aggregator fail ("the parties disagree on
    # the round"), so the one out of step had the honest aggregator named.
    import torch

    from falsevfl_secure.network.network import RunAborted

    (_, x, y), helper = he
    sent = {"X": [("likelihood", posterior(x, torch.ones(3, 4)))], "Y": [("posterior", posterior(y, torch.ones(3, 4)))]}
    with pytest.raises(RunAborted) as ended:  # the active party's heartbeat: in 'posterior', waiting on the aggregator
        combine_at_aggregator(helper, sent, heard=("posterior", 5, "aggregator"))
    assert (ended.value.blame.role, ended.value.blame.how) == ("X", "refused")


@pytest.mark.parametrize("build", ["weakened: the round the active party shows decides", "shipped"])
def test_a_party_that_skips_a_resumed_runs_first_step_is_named_not_the_one_that_took_it(he, monkeypatch, build):
    # Review finding: in a resumed he run, Y sent its first round's frame where X sent its resume-ack; two parties
    # are no majority, and the active party (already in the round, waiting on the aggregator) named honest X.
    import hashlib

    import torch

    from falsevfl_secure.network.network import RunAborted
    from falsevfl_secure.transport import sums

    (_, _, y), helper = he
    if build.startswith("weakened"):
        monkeypatch.setattr(sums, "_resuming", lambda peers, forwarded: False)
    digest = hashlib.sha256(b"the resume answer").digest()
    sent = {"X": [("resume-ack", digest)], "Y": [("posterior", posterior(y, torch.ones(3, 4)))]}
    with pytest.raises(RunAborted) as ended:
        combine_at_aggregator(helper, sent, heard=("posterior", 5, "aggregator"), told=(("resume-ack", digest),))
    named = (ended.value.blame.role, ended.value.blame.how)
    assert named == (("X", "refused") if build.startswith("weakened") else ("Y", "refused")), named
    if not build.startswith("weakened"):  # and where the run does not resume, X's resume-ack is the frame out of step,
        began = time.monotonic()  # named at once: the active party's heartbeat shows it in a round, waiting (review:
        with pytest.raises(RunAborted) as ended:  # the aggregator waited its whole deadline, and was named for it)
            combine_at_aggregator(helper, sent, heard=("posterior", 5, "aggregator"))
        assert (ended.value.blame.role, ended.value.blame.how) == ("X", "refused") and time.monotonic() - began < 10


def test_a_partys_ack_of_a_loss_ahead_of_the_active_partys_notice_is_no_rounds_frame(he):
    # Review finding: a survivor that acked the active party's loss notice before the notice reached the aggregator
    # had its ack taken as its round's frame; after the loss the aggregator's drain then ate the survivor's next
    # step's frame, and the aggregator, the survivor and the active party waited on each other for 900 s.
    import torch

    from falsevfl_secure.network.network import notice_digest
    from falsevfl_secure.network.peers import Peers
    from falsevfl_secure.transport.sums import serve_combiner

    (_, x, _), helper = he
    aggregator, links = hub("aggregator", ("active", "X", "Y"), "active", "X", "Y")
    aggregator.coordinator, aggregator.tolerated, aggregator.min_deadline_s = "active", {"X", "Y"}, 1.5
    aggregator.allow({"posterior": 1 << 20})
    deliver(aggregator, links["active"], "active", "bounds", json.dumps({"posterior": 12}).encode())
    notice = {"lost": ["Y"], "stage": 1, "epoch": 0, "index": 1, "plan": 1}
    deliver(aggregator, links["X"], "X", "lost-ack", notice_digest(notice))  # Y crashed; X acked first ...
    deliver(aggregator, links["active"], "active", "lost", json.dumps(notice).encode())  # ... which comes now
    serving = threading.Thread(target=serve_combiner, args=(Peers(aggregator, ("active", "X", "Y", "aggregator"),
                                                                   3, 3, 0), helper), daemon=True)
    serving.start()
    time.sleep(0.3)
    deliver(aggregator, links["X"], "X", "posterior", posterior(x, torch.ones(3, 4)))  # X's step, run again
    forwarded, deadline = [], time.monotonic() + 5
    while "posterior" not in forwarded and time.monotonic() < deadline:
        forwarded += [e.tag for e in data(sent(links["active"]))]  # (taken off the link as they come)
        time.sleep(0.05)
    assert forwarded == ["bounds-ack", "lost-ack", "posterior"]  # before: the ack, then nothing for 900 s
    assert not aggregator._mail["X"] and aggregator.aborted is None


def test_a_peers_error_of_its_own_says_where_to_look_and_nothing_of_its_text():
    """Operations trial: a passive party read "agency stopped with an error of its own (InputError)", a type
    name; it now reads what kind of problem it is and where it is told (the text itself stays with its owner)."""
    from falsevfl_secure.network.network import Blame

    said = Blame("agency", "failed", kind="InputError").text()
    assert said == ("agency stopped with an error of its own (InputError: its input, its own file or a party it "
                    "expected; its host's output says which) while no round was running (set-up, alignment or "
                    "shut-down)")
    assert Blame("agency", "failed", kind="KeyError").text().startswith("agency stopped with an error of its own "
                                                                         "(KeyError)")


@pytest.mark.parametrize("payload", [b"\0" * 7, b"\0" * 8 * 100, (9_000_001).to_bytes(8, "little")],
                         ids=["not whole keys", "too many keys", "a stage that does not train"])
def test_a_malformed_resume_frame_is_its_senders_refusal(payload):
    """Red team: a resume frame another role cannot read ended the run naming its receiver as failed; it is now
    the sender's refusal, named to every role."""
    import numpy as np

    from falsevfl_secure.runtime.distributed import _keys

    with pytest.raises(wire.Refused) as refused:
        _keys(payload, "party1")
    assert refused.value.offender == "party1" and "the resume step of party1" in str(refused.value)
    assert _keys(np.array([1_000_003, 2_000_000], dtype="<i8").tobytes(), "party1").tolist() == [1_000_003, 2_000_000]


@pytest.mark.parametrize("tolerated", [False, True])
def test_a_party_that_never_acknowledges_a_loss_notice_is_named_within_its_deadline(tolerated):
    # Before: the active party's drain of each survivor's 'lost-ack' ended at the deadline in silence and the run
    # went on as if it had been acknowledged; the silent party was never named.
    from falsevfl_secure.network.network import RunAborted, notice_digest

    active, links = hub("active", ("X", "Y"), "X", "Y")
    active.coordinator, active.min_deadline_s = "active", 0.3
    active.tolerated = {"X", "Y"} if tolerated else set()
    notice = {"lost": ["Z"], "stage": 1, "epoch": 0, "index": 1, "plan": 1}
    deliver(active, links["Y"], "Y", "lost-ack", notice_digest(notice))
    assert active.drain("Y", "lost-ack") == notice_digest(notice)  # an answer in time: taken, nobody named
    assert active.aborted is None and not active.lost
    began = time.monotonic()
    if tolerated:  # X leaves the run: the active party announces it at the next step
        assert active.drain("X", "lost-ack") is None and active.lost["X"].how == "stuck"
        assert active.take_losses()[0].role == "X" and active.aborted is None
    else:
        with pytest.raises(RunAborted, match=r"X delivered nothing \(no 'lost-ack' frame within 0.3 s\)"):
            active.drain("X", "lost-ack")
        assert (active.aborted.role, active.aborted.how) == ("X", "stuck")
    assert time.monotonic() - began < 2.0
