"""A Paillier sum cipher (python-paillier, 2048-bit keys) as a plug-in: the cost FATE users know, measured
beside CKKS on the same seam (`bench/overhead.py --ciphers`).

It lives here, not in the package: python-paillier is not among the primitives the project ships
(`cryptography`, libsodium, `hashlib`, TenSEAL, gRPC's TLS), so no run of the system can select it. It is
one file plus one registration line (`register(Paillier())`, in `bench/overhead.py`), which is what adding a
cipher takes.

Encoding. A value x on the 2^-16 grid is the integer v = round(x 2^16), |x| < 2^30 (so |v| < 2^46); a
party puts u = v + 2^46 (>= 0, < 2^47) into a 64-bit slot, 31 slots to a plaintext (31 * 64 < 2047
bits of n), slot 0 of the first plaintext holding 1 (the count of addends). Encryption is g^m r^n mod n^2
with g = n + 1 (phe's `raw_encrypt`, r from the OS's entropy); the aggregator multiplies the parties'
ciphertexts slot-plaintext by slot-plaintext (adds them); the active party decrypts, reads the count m
from slot 0 and each sum as (slot - m 2^46) 2^-16, exact (m < 2^17 addends fit a slot). A refused input
sends an ERROR frame that says only that it refused. Wire: a byte frame (`secure.frames`) whose one blob
is the ciphertexts, each 512 big-endian bytes (an element of Z_{n^2}).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import phe
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falsevfl_secure.errors import ProtocolError  # noqa: E402
from falsevfl_secure.secure import frames  # noqa: E402
from falsevfl_secure.secure.errors import SecureRangeError  # noqa: E402
from falsevfl_secure.secure.fixed_point import encode_fixed_point  # noqa: E402
from falsevfl_secure.transport.ciphers.base import ActiveKeyProtocol, SumCipher  # noqa: E402
from falsevfl_secure.transport.rounds import Round  # noqa: E402

KEY_BITS = 2048
SLOT_BITS, VALUE_BITS, SLOTS = 64, 46, 31  # 31 slots of 64 bits fit under a 2048-bit n
RANGE = 2.0**30  # |x| < 2^30: |round(x 2^16)| < 2^46
CIPHERTEXT_BYTES = 2 * KEY_BITS // 8
Kind = frames.Kind


class PaillierCipher(SumCipher):
    protection = "paillier"
    combined_by = "aggregator"

    def __init__(self, public: phe.PaillierPublicKey, private: phe.PaillierPrivateKey | None = None,
                 me: str = "") -> None:
        self.public, self.private, self.me = public, private, me

    def protect(self, round: Round, value: Tensor, n_addends: int) -> tuple[bytes, SecureRangeError | None]:
        try:
            grid = encode_fixed_point(value, limit=RANGE).reshape(-1).numpy()
        except SecureRangeError as refusal:
            notice = f"{self.me} refused its own input of round {round.name!r} (outside paillier's range)"
            return frames.encode(Kind.ERROR, [notice.encode()], round.index), refusal
        slots = [1, *(int(v) + (1 << VALUE_BITS) for v in grid)]  # the addend count, then the values
        blob = b"".join(self.public.raw_encrypt(_pack(slots[i:i + SLOTS])).to_bytes(CIPHERTEXT_BYTES, "big")
                        for i in range(0, len(slots), SLOTS))
        return frames.encode(Kind.DATA, [blob], round.index), None

    def wire_bytes(self, round: Round, numel: int) -> int:
        return 4096 + CIPHERTEXT_BYTES * math.ceil((numel + 1) / SLOTS)

    def combine(self, round: Round, messages: Mapping[int, bytes], shape: tuple[int, ...] | None) -> bytes:
        batch = [frames.decode(m) for m in messages.values()]
        refusals = [f for f in batch if f.kind is Kind.ERROR]
        if refusals:
            return frames.encode(Kind.ERROR, refusals[0].blobs, refusals[0].round)
        if {f.kind for f in batch} != {Kind.DATA} or len({f.round for f in batch}) != 1 \
                or len({len(f.blobs[0]) for f in batch}) != 1:
            raise ProtocolError("paillier aggregator: the parties disagree on the round or its size")
        total = [1] * (len(batch[0].blobs[0]) // CIPHERTEXT_BYTES)
        square = self.public.nsquare
        for frame in batch:
            for j, c in enumerate(_ciphertexts(frame.blobs[0], square)):
                total[j] = total[j] * c % square  # Paillier: the product of ciphertexts encrypts the sum
        blob = b"".join(c.to_bytes(CIPHERTEXT_BYTES, "big") for c in total)
        return frames.encode(Kind.DATA, [blob], batch[0].round)

    def reveal(self, round: Round, combined: bytes, shape: tuple[int, ...], own: Tensor | None) -> Tensor:
        frame = frames.decode(combined, expect=(Kind.DATA, Kind.ERROR))
        if frame.kind is Kind.ERROR:
            raise SecureRangeError(frame.text())
        if frame.round != round.index or len(frame.blobs) != 1:
            raise ProtocolError(f"round {round.name!r}: the aggregator forwarded another round or frame")
        slots = [s for c in _ciphertexts(frame.blobs[0], self.public.nsquare)
                 for s in _unpack(self.private.raw_decrypt(c))]
        numel, count = math.prod(shape), slots[0]
        sums = np.array(slots[1:numel + 1], dtype=object) - count * (1 << VALUE_BITS)
        total = torch.from_numpy(sums.astype(np.int64)).double().reshape(shape) / 2.0**16
        return total if own is None else total + torch.round(own.double() * 2**16) / 2**16

    @staticmethod
    def range_under(protocol, n_addends: int) -> float:
        return RANGE

    def reveal_error(self, n_addends: int, magnitude: float) -> float:
        return n_addends * (2.0**-17 + magnitude * 2.0**-52)


def _pack(slots: list[int]) -> int:
    return sum(s << (SLOT_BITS * i) for i, s in enumerate(slots))


def _unpack(plaintext: int) -> list[int]:
    mask = (1 << SLOT_BITS) - 1
    return [(plaintext >> (SLOT_BITS * i)) & mask for i in range(SLOTS)]


def _ciphertexts(blob: bytes, square: int) -> list[int]:
    if len(blob) % CIPHERTEXT_BYTES:
        raise ProtocolError(f"paillier: a message of {len(blob)} bytes is not whole ciphertexts")
    out = [int.from_bytes(blob[i:i + CIPHERTEXT_BYTES], "big") for i in range(0, len(blob), CIPHERTEXT_BYTES)]
    if any(not 0 < c < square for c in out):
        raise ProtocolError("paillier: a ciphertext is not an element of Z_{n^2}")
    return out


@dataclass(frozen=True)
class Paillier(ActiveKeyProtocol):
    name: ClassVar[str] = "paillier"
    protection: ClassVar[str] = PaillierCipher.protection
    cipher_class: ClassVar[type[SumCipher]] = PaillierCipher

    def make_keys(self) -> tuple[bytes, object]:
        public, private = phe.generate_paillier_keypair(n_length=KEY_BITS)
        return public.n.to_bytes(KEY_BITS // 8, "big"), private

    def load_public(self, data: bytes) -> object:
        return _public(data)

    def build(self, public: object, secret: object | None, me: str, role: str) -> SumCipher:
        return PaillierCipher(public, secret, me)

    def in_process(self, parties: int, active: int = 0) -> tuple[list[SumCipher], SumCipher | None]:
        public, private = phe.generate_paillier_keypair(n_length=KEY_BITS)
        ciphers = [PaillierCipher(public, private if k == active else None, f"party{k}") for k in range(parties)]
        return ciphers, PaillierCipher(public, None, "aggregator")


def _public(data: bytes) -> phe.PaillierPublicKey:
    n = int.from_bytes(data, "big")
    if len(data) != KEY_BITS // 8 or n.bit_length() != KEY_BITS:
        raise ProtocolError(f"paillier: the public key is not a {KEY_BITS}-bit modulus")
    return phe.PaillierPublicKey(n)

