"""Fixed-schema byte frames: how byte payloads (ciphertexts, a public context, an error) cross roles.

Nothing another role sends is ever unpickled. A frame is a 12-byte header -- magic ``FVFR``, format
version, kind, round index (-1: none), number of blobs (big-endian) -- then one uint64 length per blob,
then the blobs. `decode` checks every field and every length against the bytes actually received
before it slices anything, and refuses what does not fit with a `SecureMessageError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from .errors import SecureMessageError

_MAGIC = b"FVFR"
_VERSION = 1
_HEADER = struct.Struct(">4sBBhI")  # magic, version, kind, round, n_blobs
_LENGTH = struct.Struct(">Q")
MAX_BLOBS = 1 << 20


class Kind(IntEnum):
    DATA = 1  # a round's payload (ciphertext chunks)
    STOP = 2  # the sender has finished
    ERROR = 3  # the sender refused its own input; one blob: the UTF-8 message
    CONTEXT = 4  # one blob: a serialised public CKKS context


@dataclass(frozen=True)
class Frame:
    kind: Kind
    round: int
    blobs: tuple[bytes, ...]

    def text(self) -> str:
        """The message of an ERROR frame."""
        return self.blobs[0].decode("utf-8", errors="replace") if self.blobs else ""


def encode(kind: Kind, blobs: tuple[bytes, ...] | list[bytes] = (), round_index: int = -1) -> bytes:
    header = _HEADER.pack(_MAGIC, _VERSION, int(kind), int(round_index), len(blobs))
    return header + b"".join(_LENGTH.pack(len(b)) for b in blobs) + b"".join(bytes(b) for b in blobs)


def decode(data: bytes, expect: tuple[Kind, ...] = tuple(Kind)) -> Frame:
    """Parse a frame, refusing anything that is not exactly one well-formed frame of an expected kind."""
    if len(data) < _HEADER.size:
        raise SecureMessageError(f"a frame of {len(data)} bytes is shorter than its header")
    magic, version, kind, round_index, n_blobs = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise SecureMessageError("not a FALSE-VFL frame (bad magic or version)")
    if kind not in {int(k) for k in expect}:
        raise SecureMessageError(f"unexpected frame kind {kind}; expected {[k.name for k in expect]}")
    body = _HEADER.size + n_blobs * _LENGTH.size
    if n_blobs > MAX_BLOBS or body > len(data):
        raise SecureMessageError(f"a frame announces {n_blobs} blobs but holds {len(data)} bytes")
    lengths = [_LENGTH.unpack_from(data, _HEADER.size + i * _LENGTH.size)[0] for i in range(n_blobs)]
    if body + sum(lengths) != len(data):
        raise SecureMessageError(f"a frame's blob lengths add up to {sum(lengths)}, not {len(data) - body} bytes")
    blobs, offset = [], body
    for length in lengths:
        blobs.append(bytes(data[offset:offset + length]))
        offset += length
    return Frame(Kind(kind), round_index, tuple(blobs))
