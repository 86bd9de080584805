"""The one backend of every protocol: each sum through the protocol's cipher, each broadcast in clear.

A sum (`SumBackend.sum_to_active`): every passive party protects its contribution and sends the message to
the combiner; where the active party combines (`plain`, `mpc`), it protects its own contribution too,
combines every message and reveals the sum; where a helper combines (`he`'s aggregator, which holds no
key), the helper's loop (`serve_combiner`) combines the passive parties' messages and forwards one message
to the active party, which reveals the sum and adds its own contribution. The cipher
(`transport.ciphers.base.SumCipher`) says how each step is done; this module says who does it and when.
A party whose input the cipher refuses still sends its message (a refusal that carries none of its
values), so nobody is left waiting, and then raises.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import torch
from torch import Tensor

from ..errors import ProtocolError
from ..network.network import ANNOUNCEMENTS, Announced, PartyLost, epoch_notice, notice_digest
from ..network.peers import Peers
from ..network.wire import Refused, peer_json
from ..secure import frames
from ..secure.errors import SecureMessageError, SecureRangeError
from .rounds import Round, by_name
from .views import View

STOP = "stop"
RESUME_ACK = "resume-ack"  # a resumed run's first word to a helper, from every party (runtime/distributed.py)
AGGREGATED_VALUES = 1 << 22  # the most values of one sum a helper takes (FedHSSL's model average: ~10^5)
POLL_S = 0.05  # how often a helper looks at the active party's heartbeat while it waits to see its round


class Contribution(ProtocolError):
    """A helper's cipher refuses one party's message of a round on its own: `rank` is its sender's (the helper
    names it; review finding: the helper's own failure named the honest helper)."""

    def __init__(self, text: str, rank: int) -> None:
        super().__init__(text)
        self.rank = rank


class Disagreement(ProtocolError):
    """The parties' messages of a round hold different numbers of values (`counts`, by rank): only the active
    party, which knows the sum's shape, can tell whose is wrong, so the helper tells it (`_combined`)."""

    def __init__(self, text: str, counts: dict[int, int]) -> None:
        super().__init__(text)
        self.counts = counts


class SumBackend:
    """One party's side of a protocol: sums through `cipher`, broadcasts in clear (inside the links' TLS)."""

    def __init__(self, peers: Peers, cipher, view: View | None = None) -> None:
        self.peers, self.cipher, self.view = peers, cipher, view
        self.bare = cipher  # without a noise stage
        self.protection, self.is_active = cipher.protection, peers.is_active
        # Where the protected messages go: the active party, or the helper (ranks K, K + 1, ...) that combines.
        self.combiner = peers.active_index if cipher.combined_by is None else peers.n_parties

    def _record(self, round: Round, kind: str, peer: int, value, protection: str | None = None) -> None:
        if self.view is not None:
            self.view.add(round.name, kind, peer, protection or self.protection, value)

    def _passive(self) -> list[int]:
        return [k for k in self.peers.alive if k != self.peers.active_index]

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        """Every party calls this with its contribution; the active party gets the sum (float32), the others None."""
        value = value.detach().to("cpu", torch.float32).contiguous()
        if self.view is not None:
            self._record(round, "sent", self.peers.rank, value)
        n_addends = len(self.peers.alive)
        if not self.is_active:
            message, refusal = self.cipher.protect(round, value, n_addends)
            self.peers.send(self.combiner, round.name, message)
            if refusal is not None:
                me = self.peers.names[self.peers.rank]
                raise SecureRangeError(self.cipher.explain(round, refusal, me, n_addends)) from None
            return None
        total = self._reveal(round, value, n_addends).to(torch.float32)
        self._record(round, "revealed", -1, total)
        return total

    def _reveal(self, round: Round, value: Tensor, n_addends: int) -> Tensor:
        shape = tuple(value.shape)
        if self.combiner != self.peers.rank:  # a helper combined the passive parties' messages
            combined = self._receive(round, self.combiner, shape)
            me, helper = self.peers.names[self.peers.rank], self.peers.names[self.combiner]
            try:
                return self.cipher.reveal(round, combined, shape, own=finite_own(round, value, me))
            except Refused as refusal:  # the helper's word on the parties' messages, judged by this sum's shape
                if refusal.offender not in (self.peers.names[k] for k in self._passive()):
                    refusal.offender = helper  # (a helper that names no passive party of this run names itself)
                raise self.peers.network.refuse(refusal, round.name, by=helper) from None
        own, refusal = self.cipher.protect(round, value, n_addends)
        messages = {self.peers.rank: own}
        for sender in self._passive():
            messages[sender] = self._receive(round, sender, shape)
        combined = self.cipher.combine(round, dict(sorted(messages.items())), shape)
        if refusal is not None:
            me = self.peers.names[self.peers.rank]
            raise SecureRangeError(self.cipher.explain(round, refusal, me, n_addends)) from None
        return self.cipher.reveal(round, combined, shape, own=None)

    def _receive(self, round: Round, sender: int, shape: tuple[int, ...]) -> bytes:
        """One message of `round` from `sender`, of the cipher's exact size where it has one; recorded."""
        message, numel = self.peers.recv(sender, round.name), math.prod(shape)
        expected = self.cipher.message_bytes(round, numel) if sender < self.peers.n_parties else None
        if expected is not None and len(message) != expected:
            raise Refused(f"round {round.name!r}: field 'shape': {self.peers.names[sender]} sent {len(message)} "
                          f"bytes, a message of {numel} values under {self.protection} holds {expected}",
                          self.peers.names[sender])  # the sender's refusal, named to every role (red team)
        if self.view is not None:
            self._record(round, "received", sender, self.cipher.seen(message, shape))
        return message

    def broadcast(self, round: Round, value: Tensor | None, shape: tuple[int, ...]) -> Tensor:
        if self.is_active:
            buffer = value.detach().to("cpu", torch.float32).contiguous()
            payload = buffer.numpy().tobytes()
            for party in self._passive():
                self.peers.send(party, round.name, payload)
            return buffer
        buffer = recv_float32(self.peers, self.peers.active_index, round.name, shape)
        self._record(round, "received", self.peers.active_index, buffer, "clear")
        return buffer

    def declare(self, values: dict[str, int]) -> None:
        """At the active party, where a helper combines: each sum's largest number of values, to the helper
        (its only bound on what the parties may send it); waits for its answer, so no round outruns it."""
        if not self.is_active or self.combiner == self.peers.rank:
            return
        self.peers.send(self.combiner, "bounds", json.dumps(values).encode())
        self.peers.network.recv(self.peers.names[self.combiner], "bounds-ack", self.peers.network.deadline_s)

    def use_noise(self, stage) -> None:
        """Every sum of this party through `stage` (a `ciphers.noise.NoiseStage`) before the cipher; None: none."""
        self.cipher = self.bare if stage is None else stage.around(self.bare, lambda: len(self.peers.alive))

    def wire_bytes(self, round: Round, numel: int) -> int:
        """The most bytes one frame of `round` with `numel` values takes: the cipher's for a sum, float32 else."""
        return self.cipher.wire_bytes(round, numel) if round.is_aggregate else 4 * numel

    def rekey(self, pair_keys: dict[int, bytes]) -> None:
        """Keys among the parties still in the run, from fresh pair keys (a party left)."""
        self.cipher.rekey(pair_keys, self.peers.alive)

    def close(self, clean: bool = True) -> None:
        self.cipher.close()  # e.g. kills a helper process, also when the run failed
        if clean and not self.is_active and self.combiner != self.peers.active_index:
            self.peers.send(self.combiner, STOP, frames.encode(frames.Kind.STOP))


def recv_float32(peers: Peers, src: int, tag: str, shape: tuple[int, ...]) -> Tensor:
    """A float32 tensor of the declared `shape` from rank `src`; anything else is refused."""
    payload = peers.recv(src, tag)
    if len(payload) != 4 * math.prod(shape):  # the sender's refusal, named to every role (review finding)
        raise Refused(f"round {tag!r}: field 'shape': {peers.names[src]} sent {len(payload)} bytes, the declared "
                      f"shape {tuple(shape)} holds {4 * math.prod(shape)}", peers.names[src])
    return torch.from_numpy(np.frombuffer(payload, dtype="<f4").copy()).reshape(shape)


def sum_in_process(round: Round, values: list[Tensor], ciphers: list, helper=None, active: int = 0) -> Tensor:
    """The sum `SumBackend` reveals, with every party's cipher (`Protocol.in_process`) in one process: each
    party protects its value, the combiner combines, the active party reveals. For tests and benchmarks."""
    shape, k = tuple(values[active].shape), len(values)
    messages = {}
    for rank, (cipher, value) in enumerate(zip(ciphers, values, strict=True)):
        if rank != active or helper is None:
            message, refusal = cipher.protect(round, value.to(torch.float32).contiguous(), k)
            if refusal is not None:  # named as the backend names it
                raise SecureRangeError(cipher.explain(round, refusal, f"party{rank}", k)) from None
            messages[rank] = message
    if helper is None:
        return ciphers[active].reveal(round, ciphers[active].combine(round, messages, shape), shape, own=None)
    combined = helper.combine(round, messages, None)
    own = finite_own(round, values[active].to(torch.float32), f"party{active}")
    return ciphers[active].reveal(round, combined, shape, own=own)


def finite_own(round: Round, value: Tensor, me: str) -> Tensor:
    """The active party's own contribution, added in clear to what a helper combined: refused when non-finite,
    as every other party's is (it would turn the whole sum into NaN)."""
    if not bool(torch.isfinite(value).all()):
        raise SecureRangeError(f"round {round.name!r}: {me} (the active party) refused its own input: non-finite "
                               "(NaN/inf)")
    return value


def serve_combiner(peers: Peers, cipher, view: View | None = None, on_recorded=None, recorded_rounds: int = 0
                   ) -> None:
    """A helper's loop: for every round, combine the passive parties' messages and forward the result to
    the active party, until every passive party has said stop. The helper's cipher holds no key that
    reveals anything. With `view`, the first `recorded_rounds` sums (those of the method's probe step) are
    recorded and then handed to `on_recorded`. It holds no model configuration: the active party declares
    each sum's largest size before any is combined (`declare`), and a frame over it is refused as it arrives.
    A party's message out of step, or one it refuses, is refused naming that party (`_agreed`, `_combined`)."""
    passive = [k for k in range(peers.n_parties) if k != peers.active_index]
    _bounded(peers, cipher)
    forwarded = 0  # the active party's rounds entered when this helper forwarded its last sum
    while True:
        try:
            if peers.network.head(peers.names[peers.active_index]) in ANNOUNCEMENTS:
                raise Announced()
            received = {k: peers.network.recv_any(peers.names[k], "a round's messages") for k in passive}
        except (PartyLost, Announced) as word:
            passive = _announced(peers, cipher, passive)  # what the active party said before a loss comes first
            if isinstance(word, PartyLost):
                passive = _after_loss(peers, passive)
            continue
        if {tag for tag, _ in received.values()} == {STOP}:
            return
        if {tag for tag, _ in received.values()} == {RESUME_ACK}:
            _resumed_alike(peers, received)
            continue
        tag = _agreed(peers, received, forwarded)
        messages = {k: data for k, (_, data) in sorted(received.items())}
        if view is not None:
            view = _record(view, tag, cipher, messages, on_recorded, recorded_rounds)
        peers.send(peers.active_index, tag, _combined(peers, cipher, tag, messages))
        forwarded = getattr(peers.network.links.get(peers.names[peers.active_index]), "progress", 0)
        peers.network.enter(tag)  # its heartbeat shows progress, and its own waits get round deadlines


def _resumed_alike(peers: Peers, received: dict[int, tuple[str, bytes]]) -> None:
    """A resumed run: every passive party's digest of the resume answer against the active party's (a malicious
    active party telling two parties different epochs would have their rows of different batches summed here)."""
    active = peers.names[peers.active_index]
    told = peers.recv(peers.active_index, RESUME_ACK)
    for k, (_, digest) in sorted(received.items()):
        if digest != told:
            raise peers.network.refuse(Refused(
                f"{peers.names[k]} resumes from other epochs than {active} told this aggregator (one of the two says "
                "otherwise): refused, as rows of different batches would be summed", peers.names[k]), RESUME_ACK)


def _agreed(peers: Peers, received: dict[int, tuple[str, bytes]], forwarded: int) -> str:
    """The round of every passive party's frame. One out of step is refused, naming its sender: out of step with
    most parties, or where no round has most, with the round the active party shows it waits on this helper in
    (`_awaited`); so is a frame of a tag that is no sum's (review finding: the helper failed, and was named). Where
    some sent a resume answer's digest, the active party's own `resume-ack` tells whether that step is due."""
    tags = {peers.names[k]: tag for k, (tag, _) in received.items()}
    if RESUME_ACK in tags.values() and _resuming(peers, forwarded):  # a resumed run's first step (review:
        expected = RESUME_ACK  # two parties are no majority, and the active party's round named the honest one)
    else:  # (a resume-ack where the active party sent none is out of step: the other frames' round decides)
        rounds = [tag for tag in tags.values() if tag != RESUME_ACK]
        expected = _most(rounds) or _awaited(peers, forwarded) if rounds else None
    if expected is None:  # (the active party never showed its round: nobody can be told apart)
        raise ProtocolError(f"{peers.names[peers.rank]}: the parties disagree on the round: "
                            f"{sorted(set(tags.values()))}")
    odd = [name for name, tag in tags.items() if tag != expected] or ([] if _is_sum(expected) else list(tags))
    if odd:
        why = f"where the round is {expected[:40]!r}" if tags[odd[0]] != expected else "where a sum's message is due"
        raise peers.network.refuse(Refused(f"a frame {tags[odd[0]][:40]!r} {why}", odd[0]), expected)
    return expected


def _resuming(peers: Peers, forwarded: int) -> bool:
    """Whether the active party told this helper a resume answer's digest (its `resume-ack`, sent before any round
    of a resumed run, and only then): never once a sum went on; else its frame, or its heartbeat in a round waiting
    on this helper (which comes after that frame on the same link), decides; a passive party's resume-ack may come
    first, so it waits up to a round's deadline (review: a stray resume-ack held it the whole deadline, and the
    active party, waiting on it, named it)."""
    network, active, me = peers.network, peers.names[peers.active_index], peers.names[peers.rank]
    if forwarded:
        return False
    link, deadline = network.links.get(active), time.monotonic() + network.deadline_s
    network.waiting_on = active
    try:
        while network.head(active) is None and time.monotonic() < deadline and network.aborted is None and not \
                (link is not None and link.waiting_on == me and link.last_round):
            time.sleep(POLL_S)
    finally:
        network.waiting_on = None
    return network.head(active) == RESUME_ACK


def _most(values: list[str]) -> str | None:
    """The value more than half of `values` are (None: no such one)."""
    top = max(set(values), key=values.count)
    return top if 2 * values.count(top) > len(values) else None


def _awaited(peers: Peers, forwarded: int) -> str | None:
    """The round the active party waits on this helper in, as a heartbeat of it after the last sum this helper
    forwarded (when it had entered `forwarded` rounds) shows it; None if none does within a deadline. Meanwhile
    this helper's heartbeat says it waits on the active party (so that the active party does not name it)."""
    network, active, me = peers.network, peers.names[peers.active_index], peers.names[peers.rank]
    link, deadline = network.links.get(active), time.monotonic() + network.deadline_s
    network.waiting_on = active
    try:
        while link is not None and time.monotonic() < deadline and network.aborted is None:
            if link.waiting_on == me and link.progress > forwarded and link.last_round:
                return link.last_round
            time.sleep(POLL_S)
    finally:
        network.waiting_on = None
    return None


def _is_sum(tag: str) -> bool:
    try:
        return by_name(tag).is_aggregate
    except ProtocolError:
        return False


def _combined(peers: Peers, cipher, tag: str, messages: dict[int, bytes]) -> bytes:
    """The one frame the active party gets for a round: the sum; or this helper's own word that a party refused
    its input, naming it (never the party's text: review finding, it was passed on as the active party's error);
    or, where the messages hold different numbers of values, how many each holds (the active party, which knows
    the sum's shape, names the odd one). A message that is no frame of the round, or that the cipher refuses on
    its own, is refused naming its sender."""
    round = by_name(tag)
    batch = {k: _frame_of(peers, round, k, data) for k, data in messages.items()}
    refused = [peers.names[k] for k, frame in batch.items() if frame.kind is frames.Kind.ERROR]
    me = peers.names[peers.rank]
    if refused:
        word = f"{me}: {refused[0]} refused its own input of round {tag!r} (its message says no more)"
        return frames.encode(frames.Kind.ERROR, [word.encode()], round.index)
    try:
        return cipher.combine(round, messages, None)
    except Contribution as error:
        raise peers.network.refuse(Refused(f"round {tag!r}: {error}", peers.names[error.rank]), tag) from None
    except Disagreement as error:
        counts = {peers.names[k]: n for k, n in error.counts.items()}
        word = f"{me}: the messages of round {tag!r} hold different numbers of values: {counts}"
        return frames.encode(frames.Kind.ERROR, [word.encode(), json.dumps(counts).encode()], round.index)


def _frame_of(peers: Peers, round: Round, rank: int, data: bytes) -> frames.Frame:
    """A party's message of `round` as a helper's cipher sends it: a byte frame of this round, one blob (its
    ciphertexts or its refusal); anything else is refused, naming its sender."""
    try:
        frame = frames.decode(data, expect=(frames.Kind.DATA, frames.Kind.ERROR))
    except SecureMessageError as error:
        raise peers.network.refuse(Refused(f"round {round.name!r}: {error}", peers.names[rank]), round.name) from None
    if frame.round != round.index or len(frame.blobs) != 1:
        raise peers.network.refuse(Refused(f"round {round.name!r}: a frame of round {frame.round} with "
                                           f"{len(frame.blobs)} messages", peers.names[rank]), round.name)
    return frame


def _after_loss(peers: Peers, passive: list[int]) -> list[int]:
    """The active party announced a lost party: every frame this role sent it before is stale (it says so),
    and each other party's frames of the abandoned step are dropped; the parties it combines from now on."""
    notice = peers.network.take_notice()
    parties = set(peers.names[:peers.n_parties]) - {peers.names[peers.active_index]}
    if not set(notice["lost"]) <= parties:  # (names.index raised a ValueError for any other name: review finding)
        raise ProtocolError(f"{peers.names[peers.active_index]} announced a loss of a role that is not a passive party")
    peers.lose(peers.names.index(name) for name in notice["lost"])
    for name in notice["lost"]:
        peers.network.forget(name)  # frames of the abandoned step (it may come back)
    peers.send(peers.active_index, "lost-ack", b"")
    survivors, told = [k for k in passive if k not in peers.lost], notice_digest(notice)
    for k in survivors:
        acked = peers.network.drain(peers.names[k], "lost-ack")
        if acked is not None and acked != told:  # it was told another step: its rows would be summed with others'
            raise peers.network.refuse(Refused(
                f"{peers.names[k]} acknowledged another loss notice than the one {peers.names[peers.active_index]} "
                "sent this aggregator (one of the two says otherwise): refused, as rows of different steps would be "
                "summed", peers.names[k]), "lost-ack")
    return survivors


def _announced(peers: Peers, cipher, passive: list[int]) -> list[int]:
    """Every word of the active party waiting here, in order (the sums' bounds, a readmission); the parties it
    combines from now on."""
    while (tag := peers.network.head(peers.names[peers.active_index])) in ANNOUNCEMENTS:
        if tag == "bounds":
            _bounded(peers, cipher)
        else:
            passive = _readmitted(peers, passive)
    return passive


def _bounded(peers: Peers, cipher) -> None:
    """The active party's bounds of the sums (values per round, at most AGGREGATED_VALUES), as this helper's
    network bounds; answered, so no party sends a round before they hold."""
    try:
        values = peer_json(peers.recv(peers.active_index, "bounds"))
        bounds = {name: cipher.wire_bytes(by_name(name), min(int(v), AGGREGATED_VALUES)) for name, v in values.items()
                  if by_name(name).is_aggregate and int(v) > 0}
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):  # (int() of a JSON Infinity)
        raise ProtocolError(f"the bounds of the sums that {peers.names[peers.active_index]} sent are malformed") \
            from None
    peers.network.allow(bounds)
    peers.send(peers.active_index, "bounds-ack", b"")


def _readmitted(peers: Peers, passive: list[int]) -> list[int]:
    """The parties it combines from now on, with those the active party readmitted (its `epoch` frame); the
    active party lets the parties go on only after this helper's answer, so no round of theirs comes before."""
    notice = epoch_notice(peers.recv(peers.active_index, "epoch"))
    names = [e["record"]["name"] for e in notice["joined"]]
    if not set(names) <= set(peers.names[:peers.n_parties]) - {peers.names[peers.active_index]}:
        raise ProtocolError("the active party's epoch frame readmits a role that is not a passive party")
    back = [peers.names.index(name) for name in names]
    peers.restore(back)
    for k in back:
        peers.network.readmit(peers.names[k])
    peers.send(peers.active_index, "epoch-ack", b"")
    return sorted(set(passive) | set(back))


def _record(view: View, tag: str, cipher, messages: dict[int, bytes], on_recorded, rounds: int) -> View | None:
    """Add one round's messages; after the probe step's `rounds` sums, hand the view over and stop recording."""
    for k, data in messages.items():
        view.add(tag, "received", k, cipher.protection, cipher.seen(data, None))
    if len(view) < rounds * len(messages):
        return view
    if on_recorded is not None:
        on_recorded(view)
    return None
