"""The `he` protocol: TenSEAL CKKS under the active party's key, added by a non-colluding aggregator.

Ranks 0..K-1 are the parties, rank K the aggregator (its identity pinned in every participant's file, so
nobody else can act as it). At start-up the active party makes the secret context and sends the public
context (no secret key, no Galois keys), signed over the session id, to every other role
(`handshake.send_context`). For each sum, every passive party encrypts its contribution and sends the
ciphertexts to the aggregator (one densely packed message per round, `secure.ckks.encrypt_tensors`, each
ciphertext an encryption of zero that the party's helper process made ahead on idle CPU plus the encoded
values: `secure.ckks.ZeroPool`, each zero used once); the aggregator adds them and forwards the encrypted
sum to the active party, which decrypts it onto the fixed-point grid (no decryption noise survives,
`secure.ckks`) and adds its own contribution. Every message is a byte frame (`secure.frames`); a party
that refuses its own input sends an ERROR frame that says only that it refused (never a value), so nobody
is left waiting. Broadcasts go in clear (inside the links' TLS) among the parties.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ProtocolError
from ..secure import frames
from ..secure.ckks import ZeroPool, decrypt_tensors, encrypt_tensors, max_safe_abs, message_bound, sum_encrypted
from ..secure.errors import SecureRangeError
from ..secure.fixed_point import round_to_grid
from .distributed import Peers
from .network import PartyLost
from .plain import PlainBackend
from .rounds import AGGREGATES, VOCABULARY, Round
from .views import View

Kind = frames.Kind
STOP = "stop"
FRAME_SLACK = 4096  # a byte frame's header and lengths, or a refusal's text
AGGREGATED_VALUES = 1 << 22  # the most values of one sum the aggregator takes (FedHSSL's model average: ~10^5)


class HeBackend(PlainBackend):
    protection = "ckks"

    def __init__(self, peers: Peers, public, secret=None, view: View | None = None) -> None:
        super().__init__(peers, view)
        self.public, self.secret, self.aggregator = public, secret, peers.n_parties
        # A passive party encrypts online on zeros its helper process made ahead on idle CPU (secure.ckks).
        self.zeros = ZeroPool(public) if secret is None else None

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._record(round, "sent", self.peers.rank, value)
        if not self.is_active:
            self._send_encrypted(round, value)
            return None
        frame = self._receive(round)
        self._record(round, "received", self.aggregator, frames.encode(frame.kind, frame.blobs, frame.round))
        if len(frame.blobs) != 1:
            raise ProtocolError(f"round {round.name!r}: field 'payload': the aggregator's frame holds "
                                f"{len(frame.blobs)} messages, not one")
        total = decrypt_tensors(self.secret, frame.blobs[0], [tuple(value.shape)])[0] + round_to_grid(value)
        self._record(round, "revealed", -1, total)
        return total.to(torch.float32)

    def _send_encrypted(self, round: Round, value: Tensor) -> None:
        """Encrypt and send to the aggregator; a refused input still sends a frame (ERROR), then raises."""
        k, me = len(self.peers.alive), self.peers.names[self.peers.rank]
        try:
            message = encrypt_tensors(self.public, [value], n_addends=k, zeros=self.zeros)
        except SecureRangeError as error:
            notice = f"{me} refused its own input of round {round.name!r} (outside he's range)"
            self.peers.send(self.aggregator, round.name, frames.encode(Kind.ERROR, [notice.encode()],
                                                                       round.index))
            raise SecureRangeError(f"round {round.name!r}: {me}: {error}; he carries |x| < "
                                   f"{max_safe_abs(self.public, k):.3g} per party at K = {k} (mpc carries far more: "
                                   "run with --protocol mpc, or check the features are standardised)") from None
        self.peers.send(self.aggregator, round.name, frames.encode(Kind.DATA, [message], round.index))

    def _receive(self, round: Round) -> frames.Frame:
        """The aggregator's frame for `round`: the encrypted sum, or a party's refusal."""
        frame = frames.decode(self.peers.recv(self.aggregator, round.name), expect=(Kind.DATA, Kind.ERROR))
        if frame.kind is Kind.ERROR:
            raise SecureRangeError(frame.text())
        if frame.round != round.index:
            raise ProtocolError(f"round {round.name!r}: field 'round': the aggregator forwarded round "
                                f"{frame.round} instead")
        return frame

    def wire_bytes(self, round: Round, numel: int) -> int:
        """A sum travels as one CKKS message in a byte frame (`secure.ckks.message_bound`)."""
        return FRAME_SLACK + message_bound(self.public, numel) if round.is_aggregate else 4 * numel

    def close(self, clean: bool = True) -> None:
        if self.zeros is not None:
            self.zeros.close()  # kills its helper process, also when the run failed
        if clean and not self.is_active:
            self.peers.send(self.aggregator, STOP, frames.encode(Kind.STOP))


def serve_aggregator(peers: Peers, context, view: View | None = None, on_recorded=None, recorded_rounds: int = 0
                     ) -> None:
    """The aggregator's loop: for every round, add the passive parties' ciphertexts and forward the sum to
    the active party, until every passive party has said stop. It holds the public context only, so it
    cannot decrypt anything it handles; a party's refusal is forwarded to the active party. With `view`,
    the first `recorded_rounds` sums (those of the method's probe step) are recorded and then handed to
    `on_recorded`."""
    passive = [k for k in range(peers.n_parties) if k != peers.active_index]
    # It holds no model configuration: every sum of the vocabulary, each at most AGGREGATED_VALUES values.
    peers.network.allow({r.name: FRAME_SLACK + message_bound(context, AGGREGATED_VALUES) for r in AGGREGATES})
    while True:
        try:
            received = {k: peers.network.recv_any(peers.names[k], "a round's ciphertexts") for k in passive}
        except PartyLost:
            passive = _after_loss(peers, passive)
            continue
        tags = {tag for tag, _ in received.values()}
        if tags == {STOP}:
            return
        if len(tags) != 1:
            raise ProtocolError(f"aggregator: the parties disagree on the round: {sorted(tags)}")
        if view is not None:
            view = _record(view, {k: data for k, (_, data) in received.items()}, on_recorded, recorded_rounds)
        batch = {k: frames.decode(data) for k, (_, data) in received.items()}
        tag = tags.pop()
        peers.send(peers.active_index, tag, _forward(context, batch))
        peers.network.enter(tag)  # its heartbeat shows progress, and its own waits get round deadlines


def _after_loss(peers: Peers, passive: list[int]) -> list[int]:
    """The active party announced a lost party: every frame this role sent it before is stale (it says so),
    and each other party's frames of the abandoned step are dropped; the parties it sums from now on."""
    notice = peers.network.take_notice()
    peers.lost |= {peers.names.index(name) for name in notice["lost"]}
    peers.send(peers.active_index, "lost-ack", b"")
    survivors = [k for k in passive if k not in peers.lost]
    for k in survivors:
        peers.network.drain(peers.names[k], "lost-ack")
    return survivors


def _forward(context, batch: dict[int, frames.Frame]) -> bytes:
    """The frame the active party gets for one round: the sum, or the first refusal."""
    refusals = [f for f in batch.values() if f.kind is Kind.ERROR]
    if refusals:
        return frames.encode(Kind.ERROR, refusals[0].blobs, refusals[0].round)
    rounds = {f.round for f in batch.values()}
    kinds = {f.kind for f in batch.values()}
    if kinds != {Kind.DATA} or len(rounds) != 1 or any(len(f.blobs) != 1 for f in batch.values()):
        raise ProtocolError(f"aggregator: the parties disagree on the round: kinds {sorted(k.name for k in kinds)}, "
                            f"rounds {sorted(rounds)} (or a frame holds more than one message)")
    return frames.encode(Kind.DATA, [sum_encrypted(context, [f.blobs[0] for f in batch.values()])], rounds.pop())


def _record(view: View, received: dict[int, bytes], on_recorded, rounds: int) -> View | None:
    """Add one round's frames; after the probe step's `rounds` sums, hand the view over and stop recording."""
    for k, data in received.items():
        view.add(_round_name(data), "received", k, "ckks", data)
    if len(view) < rounds * len(received):
        return view
    if on_recorded is not None:
        on_recorded(view)
    return None


def _round_name(data: bytes) -> str:
    try:
        index = frames.decode(data).round
    except Exception:  # a malformed frame is refused just below; the view only needs a label
        return "?"
    return VOCABULARY[index].name if 0 <= index < len(VOCABULARY) else "?"
