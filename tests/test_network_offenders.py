"""A misbehaving peer is named, never an honest one (review findings on the network's bounds): a hub relays only
between the roles it is the relay of, and refuses a sender that interleaves frames through it; a peer's numbers
and texts too large or malformed to parse are refused naming it; an abort's and a heartbeat's texts are plain and
short; a receiver whose heartbeat counts up while it reads nothing is named. Each test drives a `Network` directly
with stand-in links (no sockets) and says what the code before the fix did."""

from __future__ import annotations

import json
import threading
import time
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

    notice = {"lost": ["Z"], "stage": 1, "epoch": 0, "index": 0}  # (a name another role's pins hold)
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
