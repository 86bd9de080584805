"""The `he` protocol: TenSEAL CKKS under the active party's key, added by a non-colluding aggregator.

Roles: ranks 0..K-1 are the parties, rank K the aggregator. At start-up the active party makes the
secret context and sends the public context (no secret key, no Galois keys) to every party and the
aggregator. For each sum, every passive party encrypts its contribution and sends the ciphertexts
to the aggregator; the aggregator adds them and forwards the encrypted sum to the active party,
which decrypts it and adds its own contribution in clear. Broadcasts go in clear among the parties.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..secure.ckks import (
    decrypt_tensor,
    encrypt_tensor,
    load_public_context,
    make_secret_context,
    public_context_bytes,
    sum_encrypted,
)
from .plain import PlainBackend

_STOP = "stop"


def _exchange_context(n_parties: int, active: int, is_active: bool) -> tuple[object, bytes]:
    """Broadcast the active party's public context to every rank (parties and aggregator)."""
    secret = make_secret_context() if is_active else None
    box = [public_context_bytes(secret) if is_active else None]
    dist.broadcast_object_list(box, src=active)
    return secret, box[0]


class HeBackend(PlainBackend):
    protocol = "he"
    protection = "ckks"

    def __init__(self, party: int, n_parties: int, active_party: int, group=None, view: list | None = None):
        super().__init__(party, n_parties, active_party, group=group, view=view)
        self.aggregator = n_parties
        self.secret, public = _exchange_context(n_parties, active_party, party == active_party)
        self.public = load_public_context(public)
        self.context_bytes = len(public)

    def sum_to_active(self, name: str, value: Tensor) -> Tensor | None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        if self.party != self.active_party:
            chunks = encrypt_tensor(self.public, value, n_addends=self.n_parties)
            dist.send_object_list([name, chunks], dst=self.aggregator)
            self.bytes_counter.sent += sum(len(c) for c in chunks)
            return None
        box = [None, None]
        dist.recv_object_list(box, src=self.aggregator)
        round_name, chunks = box
        self.bytes_counter.received += sum(len(c) for c in chunks)
        total = decrypt_tensor(self.secret, chunks, tuple(value.shape)).to(torch.float32)
        if self.view is not None:  # what the active party learns: the decryption of what it received
            self.view.append({"round": name, "from": self.aggregator, "protection": "ckks", "value": total.clone()})
        return total + value

    def close(self) -> None:
        if self.party != self.active_party:
            dist.send_object_list([_STOP, []], dst=self.aggregator)


def run_aggregator(n_parties: int, active: int, view: list | None = None, record_rounds: int | None = None,
                   on_recorded=None) -> None:
    """The aggregator's loop: for every round, add the passive parties' ciphertexts and forward the
    sum to the active party, until every passive party has said stop. It holds the public context
    only, so it cannot decrypt anything it handles.

    `view` records what it receives: every round, or only the first `record_rounds`, after which
    `on_recorded(view)` is called once (how `simulate --audit` saves the aggregator's view)."""
    _, public = _exchange_context(n_parties, active, False)
    context = load_public_context(public)
    passive = [k for k in range(n_parties) if k != active]
    rounds = 0
    while True:
        parts, names = [], set()
        recording = view is not None and (record_rounds is None or rounds < record_rounds)
        for k in passive:
            box = [None, None]
            dist.recv_object_list(box, src=k)
            names.add(box[0])
            parts.append(box[1])
            if recording:
                view.append({"round": box[0], "from": k, "protection": "ckks", "value": box[1]})
        rounds += 1
        if recording and rounds == record_rounds and on_recorded is not None:
            on_recorded(view)
        if names == {_STOP}:
            return
        if len(names) != 1:
            raise RuntimeError(f"aggregator: parties disagree on the round: {sorted(names)}")
        dist.send_object_list([names.pop(), sum_encrypted(context, parts)], dst=active)
