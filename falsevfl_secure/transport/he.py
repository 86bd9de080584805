"""The `he` protocol: TenSEAL CKKS under the active party's key, added by a non-colluding aggregator.

Ranks 0..K-1 are the parties, rank K the aggregator. At start-up the active party makes the secret
context and sends the public context (no secret key, no Galois keys) to every other rank. For each sum,
every passive party encrypts its contribution and sends the ciphertexts to the aggregator; the
aggregator adds them and forwards the encrypted sum to the active party, which decrypts it onto the
fixed-point grid (no decryption noise survives, `secure.ckks`) and adds its own contribution. Every
message is a byte frame (`secure.frames`); a party that refuses its own input sends an ERROR frame, so
nobody is left waiting. Broadcasts go in clear among the parties.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ProtocolError
from ..secure import frames
from ..secure.ckks import (
    decrypt_tensor,
    encrypt_tensor,
    load_public_context,
    make_secret_context,
    max_safe_abs,
    public_context_bytes,
    sum_encrypted,
)
from ..secure.errors import SecureRangeError
from ..secure.fixed_point import round_to_grid
from .plain import PlainBackend
from .rounds import AGGREGATES, ROUNDS, Round
from .views import View

Kind = frames.Kind


def share_context(channel, n_parties: int, active_index: int, secret=None) -> bytes:
    """The active party sends its public context to every other rank (parties and aggregator); every
    rank returns the serialised public context."""
    if channel.rank == active_index:
        public = public_context_bytes(secret)
        for rank in range(n_parties + 1):
            if rank != active_index:
                channel.send(rank, frames.encode(Kind.CONTEXT, [public]))
        return public
    return frames.decode(channel.recv(active_index), expect=(Kind.CONTEXT,)).blobs[0]


class HeBackend(PlainBackend):
    protection = "ckks"

    def __init__(self, party: int, n_parties: int, active_index: int, group=None, view: View | None = None,
                 channel=None) -> None:
        super().__init__(party, n_parties, active_index, group=group, view=view)
        self.channel, self.aggregator = channel, n_parties
        self.secret = make_secret_context() if self.is_active else None
        self.public = load_public_context(share_context(channel, n_parties, active_index, self.secret))

    def sum_to_active(self, round: Round, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._record(round, "sent", self.party, value)
        if not self.is_active:
            self._send_encrypted(round, value)
            return None
        frame = self._receive(round)
        self.counter.received += sum(len(c) for c in frame.blobs)
        self._record(round, "received", self.aggregator, frames.encode(frame.kind, frame.blobs, frame.round))
        total = decrypt_tensor(self.secret, frame.blobs, tuple(value.shape)) + round_to_grid(value)
        self._record(round, "revealed", -1, total)
        return total.to(torch.float32)

    def _send_encrypted(self, round: Round, value: Tensor) -> None:
        """Encrypt and send to the aggregator; a refused input still sends a frame (ERROR), then raises."""
        try:
            chunks = encrypt_tensor(self.public, value, n_addends=self.n_parties)
        except SecureRangeError as error:
            message = (f"round {round.name!r}: party {self.party}: {error}; he carries |x| < "
                       f"{max_safe_abs(self.public, self.n_parties):.3g} per party at K = {self.n_parties} "
                       "(mpc carries far more: run with --protocol mpc, or check the features are standardised)")
            self.channel.send(self.aggregator, frames.encode(Kind.ERROR, [message.encode()], ROUNDS.index(round)))
            raise SecureRangeError(message) from error
        self.channel.send(self.aggregator, frames.encode(Kind.DATA, chunks, ROUNDS.index(round)))
        self.counter.sent += sum(len(c) for c in chunks)

    def _receive(self, round: Round) -> frames.Frame:
        """The aggregator's frame for `round`: the encrypted sum, or a party's refusal."""
        frame = frames.decode(self.channel.recv(self.aggregator), expect=(Kind.DATA, Kind.ERROR))
        if frame.kind is Kind.ERROR:
            raise SecureRangeError(frame.text())
        if frame.round != ROUNDS.index(round):
            raise ProtocolError(f"round {round.name!r}: field 'round': the aggregator forwarded round "
                                f"{frame.round} instead")
        return frame

    def close(self) -> None:
        if not self.is_active:
            self.channel.send(self.aggregator, frames.encode(Kind.STOP))


def serve_aggregator(channel, n_parties: int, active_index: int, view: View | None = None, on_recorded=None) -> None:
    """The aggregator's loop: for every round, add the passive parties' ciphertexts and forward the sum to
    the active party, until every passive party has said stop. It holds the public context only, so it
    cannot decrypt anything it handles; a party's refusal is forwarded to the active party. With `view`,
    the rounds of one step are recorded and then handed to `on_recorded`."""
    context = load_public_context(share_context(channel, n_parties, active_index))
    passive = [k for k in range(n_parties) if k != active_index]
    while True:
        received = {k: channel.recv(k) for k in passive}
        if view is not None:
            view = _record(view, received, on_recorded)
        batch = {k: frames.decode(data) for k, data in received.items()}
        if all(f.kind is Kind.STOP for f in batch.values()):
            return
        channel.send(active_index, _forward(context, batch))


def _forward(context, batch: dict[int, frames.Frame]) -> bytes:
    """The frame the active party gets for one round: the sum, or the first refusal."""
    refusals = [f for f in batch.values() if f.kind is Kind.ERROR]
    if refusals:
        return frames.encode(Kind.ERROR, refusals[0].blobs, refusals[0].round)
    rounds = {f.round for f in batch.values()}
    kinds = {f.kind for f in batch.values()}
    if kinds != {Kind.DATA} or len(rounds) != 1:
        raise ProtocolError(f"aggregator: the parties disagree on the round: kinds {sorted(k.name for k in kinds)}, "
                            f"rounds {sorted(rounds)}")
    return frames.encode(Kind.DATA, sum_encrypted(context, [f.blobs for f in batch.values()]), rounds.pop())


def _record(view: View, received: dict[int, bytes], on_recorded) -> View | None:
    """Add one round's frames; after a whole stage-1 step's sums, hand the view over and stop recording."""
    for k, data in received.items():
        view.add(_round_name(data), "received", k, "ckks", data)
    if len(view) < len(AGGREGATES) * len(received):
        return view
    if on_recorded is not None:
        on_recorded(view)
    return None


def _round_name(data: bytes) -> str:
    try:
        index = frames.decode(data).round
    except Exception:  # a malformed frame is refused just below; the view only needs a label
        return "?"
    return ROUNDS[index].name if 0 <= index < len(ROUNDS) else "?"
