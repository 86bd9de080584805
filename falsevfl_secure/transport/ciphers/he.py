"""The `he` protocol: TenSEAL CKKS under the active party's key, added by a non-colluding aggregator.

Ranks 0..K-1 are the parties, rank K the aggregator (its identity pinned in every participant's file, so
nobody else can act as it). At start-up the active party makes the secret context and sends the public
context (no secret key, no Galois keys), signed over the session id, to every other role
(`handshake.send_context`). For each sum, every passive party encrypts its contribution and sends the
ciphertexts to the aggregator (one densely packed message per round, `secure.ckks.encrypt_tensors`, each
ciphertext an encryption of zero that the party's helper process made ahead on idle CPU plus the encoded
values: `secure.ckks.ZeroPool`, each zero used once); the aggregator adds them (`transport.sums.
serve_combiner`) and forwards the encrypted sum to the active party, which decrypts it onto the fixed-point
grid (no decryption noise survives, `secure.ckks`) and adds its own contribution. Every message is a byte
frame (`secure.frames`); a party that refuses its own input sends an ERROR frame that says only that it
refused (never a value), so nobody is left waiting, and the aggregator tells the active party so in its own words,
naming the party (never passing the party's text on). Broadcasts go in clear (inside the links' TLS).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from ...errors import InputError, ProtocolError
from ...network.wire import Refused, peer_json
from ...secure import frames
from ...secure.ckks import (
    CkksParams,
    ContributionError,
    CountMismatch,
    ZeroPool,
    decrypt_tensors,
    encrypt_tensors,
    load_public_context,
    make_secret_context,
    message_bound,
    params_of,
    public_context_bytes,
    sum_encrypted,
    sum_range,
)
from ...secure.errors import SecureMessageError, SecureParameterError, SecureRangeError
from ...secure.fixed_point import PRECISION_BITS, round_to_grid
from ..rounds import Round
from ..sums import Contribution, Disagreement
from .base import ActiveKeyProtocol, SumCipher

Kind = frames.Kind
FRAME_SLACK = 4096  # a byte frame's header and lengths, or a refusal's text
REFUSAL_CHARS = 300  # the most of the aggregator's word the active party repeats in its error


class CkksCipher(SumCipher):
    """CKKS ciphertexts under the active party's key: a passive party holds the public context (and a pool
    of fresh encryptions of zero), the aggregator the public context only, the active party the secret."""

    protection = "ckks"
    combined_by = "aggregator"

    def __init__(self, public, secret=None, me: str = "", zeros: ZeroPool | None = None,
                 protocol: He | None = None) -> None:
        self.public, self.secret, self.me, self.zeros = public, secret, me, zeros
        self.protocol = protocol if protocol is not None else He()

    def protect(self, round: Round, value: Tensor, n_addends: int) -> tuple[bytes, SecureRangeError | None]:
        try:
            message = encrypt_tensors(self.public, [value], n_addends=n_addends, zeros=self.zeros)
        except SecureRangeError as refusal:
            notice = f"{self.me} refused its own input of round {round.name!r} (outside he's range)"
            return frames.encode(Kind.ERROR, [notice.encode()], round.index), refusal
        return frames.encode(Kind.DATA, [message], round.index), None

    def wire_bytes(self, round: Round, numel: int) -> int:
        """A sum travels as one CKKS message in a byte frame (`secure.ckks.message_bound`)."""
        return FRAME_SLACK + message_bound(self.public, numel)

    def combine(self, round: Round, messages: Mapping[int, bytes], shape: tuple[int, ...] | None) -> bytes:
        """The frame the active party gets for one round: the encrypted sum, or the word (its own, never the
        party's text) that a party refused its input. A message it refuses on its own raises `Contribution` with
        its sender's rank, messages of different numbers of values `Disagreement` (`sums.serve_combiner`)."""
        batch = {k: _frame_of(m, k, round) for k, m in messages.items()}
        refused = [k for k, f in batch.items() if f.kind is Kind.ERROR]
        if refused:
            word = f"{self.me}: party {refused[0]} (its rank) refused its own input of round {round.name!r}"
            return frames.encode(Kind.ERROR, [word.encode()], round.index)
        try:
            total = sum_encrypted(self.public, [f.blobs[0] for f in batch.values()])
        except ContributionError as error:
            raise Contribution(f"{self.me}: {error}", list(batch)[error.index]) from None
        except CountMismatch as error:
            raise Disagreement(f"{self.me}: {error}", dict(zip(batch, error.counts, strict=True))) from None
        return frames.encode(Kind.DATA, [total], round.index)

    def reveal(self, round: Round, combined: bytes, shape: tuple[int, ...], own: Tensor | None) -> Tensor:
        frame = frames.decode(combined, expect=(Kind.DATA, Kind.ERROR))
        if frame.kind is Kind.ERROR:
            raise _refusal(round, frame, math.prod(shape))
        if frame.round != round.index:
            raise ProtocolError(f"round {round.name!r}: field 'round': the aggregator forwarded round "
                                f"{frame.round} instead")
        if len(frame.blobs) != 1:
            raise ProtocolError(f"round {round.name!r}: field 'payload': the aggregator's frame holds "
                                f"{len(frame.blobs)} messages, not one")
        total = decrypt_tensors(self.secret, frame.blobs[0], [shape])[0]
        return total if own is None else total + round_to_grid(own)

    def explain(self, round: Round, refusal: SecureRangeError, me: str, n_addends: int) -> str:
        return (f"round {round.name!r}: {me}: {refusal}; he carries |x| < {self.addend_range(n_addends):.3g} per "
                f"party at K = {n_addends} (mpc carries far more: run with --protocol mpc, or check the features "
                "are standardised)")

    @staticmethod
    def range_under(protocol: He, n_addends: int) -> float:
        return sum_range(protocol.params.data_bits, protocol.global_scale_bits) / n_addends  # its modulus's

    def reveal_error(self, n_addends: int, magnitude: float) -> float:
        return n_addends * (2.0 ** -(PRECISION_BITS + 1) + magnitude * 2.0**-52)  # the grid, then float64

    def close(self) -> None:
        if self.zeros is not None:
            self.zeros.close()  # kills its helper process, also when the run failed


def _frame_of(message: bytes, rank: int, round: Round) -> frames.Frame:
    """One party's message: a byte frame of `round` holding one blob (else `Contribution`, naming its rank)."""
    try:
        frame = frames.decode(message, expect=(Kind.DATA, Kind.ERROR))
    except SecureMessageError as error:
        raise Contribution(f"aggregator: {error}", rank) from None
    if frame.round != round.index or len(frame.blobs) != 1:
        raise Contribution(f"aggregator: a frame of round {frame.round} holding {len(frame.blobs)} messages, in round "
                           f"{round.name!r}", rank)
    return frame


def _refusal(round: Round, frame: frames.Frame, numel: int) -> Exception:
    """What the active party raises for the aggregator's word instead of a sum (cut to REFUSAL_CHARS printable
    characters): a party's refusal of its input, or the parties' numbers of values, where it names the party
    whose number is not this sum's (`Refused`: the run ends naming it, on the aggregator's word)."""
    said = "".join(c if c.isprintable() else "?" for c in frame.text()[:REFUSAL_CHARS])
    try:
        counts = peer_json(frame.blobs[1]) if len(frame.blobs) == 2 else {}
        odd = [str(name)[:64] for name, n in counts.items() if n != numel] if isinstance(counts, dict) else []
    except ValueError:
        odd = []
    if odd:
        return Refused(f"round {round.name!r}: its message holds another number of values than this sum's {numel} "
                       f"(the aggregator says: {said})", odd[0])
    return SecureRangeError(f"round {round.name!r}: the aggregator says: {said}")


_CKKS = CkksParams()  # the defaults of he's parameters


@dataclass(frozen=True)
class He(ActiveKeyProtocol):
    """The CKKS parameters of the active party's key (`secure.ckks.CkksParams`, whose defaults they take):
    refused below 128-bit security or without room for values above the scale (`check_security`); a
    passive party and the aggregator also refuse a published context made with other parameters."""

    name: ClassVar[str] = "he"
    protection: ClassVar[str] = CkksCipher.protection
    cipher_class: ClassVar[type[SumCipher]] = CkksCipher
    poly_modulus_degree: int = _CKKS.poly_modulus_degree
    coeff_mod_bit_sizes: tuple[int, ...] = _CKKS.coeff_mod_bit_sizes
    global_scale_bits: int = _CKKS.global_scale_bits

    def __post_init__(self) -> None:
        sizes = self.coeff_mod_bit_sizes
        listed = list(sizes) if isinstance(sizes, list | tuple) else [None]
        numbers = [self.poly_modulus_degree, self.global_scale_bits, *listed]
        if not sizes or any(type(n) is not int for n in numbers):
            raise InputError(f"he: poly_modulus_degree, global_scale_bits and each of coeff_mod_bit_sizes are whole "
                             f"numbers, got {self.poly_modulus_degree!r}, {self.global_scale_bits!r}, {sizes!r}")
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(sizes))
        try:
            self.params.check_security()
        except SecureParameterError as error:
            raise InputError(f"he: {error}") from None

    @property
    def params(self) -> CkksParams:
        return CkksParams(self.poly_modulus_degree, self.coeff_mod_bit_sizes, self.global_scale_bits)

    def make_keys(self) -> tuple[bytes, object]:
        secret = make_secret_context(self.params)
        return public_context_bytes(secret), secret

    def load_public(self, data: bytes) -> object:
        public = load_public_context(data)  # re-checks the parameters' security
        if params_of(public) != self.params:
            raise SecureParameterError(f"the active party's CKKS context was made with {params_of(public)}, not "
                                       f"the agreed {self.params}")
        return public

    def build(self, public: object, secret: object | None, me: str, role: str) -> SumCipher:
        # A passive party encrypts online on zeros its helper process made ahead on idle CPU (secure.ckks).
        return CkksCipher(public, secret, me, ZeroPool(public) if role == "passive" else None, self)

    def in_process(self, parties: int, active: int = 0) -> tuple[list[SumCipher], SumCipher | None]:
        secret = make_secret_context(self.params)
        public = load_public_context(public_context_bytes(secret))
        ciphers = [CkksCipher(public, secret if k == active else None, f"party{k}", None, self)
                   for k in range(parties)]
        return ciphers, CkksCipher(public, None, "aggregator", None, self)
