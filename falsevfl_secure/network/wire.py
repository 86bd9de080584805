"""The one message format on every cross-party link: a fixed-schema envelope, never a pickle.

An envelope is a 9-byte header -- magic ``FVL1``, kind, flags, and the lengths of three names -- then the
sender's role name, the receiver's role name and the tag (a round or a set-up step), all ASCII, then the
payload bytes. The payload's own schema is the tag's (tensor bytes of a declared shape, a byte frame of
`secure.frames`, or a JSON record of a set-up step, each checked by its receiver). Payloads longer than
`FRAGMENT_BYTES` travel as consecutive fragments (flag MORE on all but the last) that the receiver joins
per sender, refusing a frame longer than `MAX_FRAME_BYTES` before it grows past it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from ..errors import ProtocolError

MAGIC = b"FVL1"
_HEADER = struct.Struct(">4sBBBBB")  # magic, kind, flags, len(src), len(dst), len(tag)
MORE = 1  # flag: more fragments of this frame follow
# What one gRPC message carries at most (plus the header). A receiver hears from a peer once per message, and
# `network.STALL_S` (10 s) of silence ends the run: 256 KiB keeps a stream alive down to ~0.2 Mbit/s of its
# share of a link (4 MiB stalled below ~3.4 Mbit/s, e.g. eight parties sending to the he aggregator at 20 Mbit/s).
FRAGMENT_BYTES = 256 << 10
MAX_FRAME_BYTES = 1 << 30  # 1 GiB: about 33 million ristretto255 points in one alignment frame
MAX_MESSAGE_BYTES = FRAGMENT_BYTES + 1024


MAX_JSON_DEPTH = 32  # the deepest record a peer sends is a few levels; json's own limit is the recursion limit's


def peer_json(payload: bytes | str) -> object:
    """JSON a peer sent: data only, and a JSONDecodeError (a ValueError) for anything malformed, also for
    nesting deeper than MAX_JSON_DEPTH (json raised RecursionError past the recursion limit, which no handler
    named, and a record just under it loaded, then broke the first `json.dumps` of it a few frames deeper)."""
    try:
        record = json.loads(payload)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
    todo = [(record, 1)]
    while todo:  # every value, without recursion
        value, level = todo.pop()
        if level > MAX_JSON_DEPTH:
            raise json.JSONDecodeError(f"nested deeper than {MAX_JSON_DEPTH} levels", "", 0)
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        todo.extend((child, level + 1) for child in children)
    return record


class Refused(ProtocolError):
    """A peer sent more than its round allows; `offender` is the role that sent it (None: the link's peer)."""

    def __init__(self, text: str, offender: str | None = None) -> None:
        super().__init__(text)
        self.offender = offender


class Kind(IntEnum):
    DATA = 1  # a round's or a set-up step's payload
    HEARTBEAT = 2  # payload: the sender's current round (ASCII)
    ABORT = 3  # payload: why the run ends (ASCII, never a value)
    BYE = 4  # the sender has finished cleanly


@dataclass(frozen=True)
class Envelope:
    kind: Kind
    src: str
    dst: str
    tag: str
    payload: bytes = b""
    more: bool = False


class _Names(dict):
    """Role names and tags as an envelope carries them (ASCII, at most 255 bytes): each checked and encoded the
    first time it is looked up, then read from here (at most `_KEPT` kept; a name beyond them is checked anew)."""

    def __missing__(self, text: str) -> bytes:
        data = text.encode("ascii")
        if len(data) > 255:
            raise ProtocolError(f"envelope: the name or tag {text[:40]!r}... is longer than 255 bytes")
        if len(self) < _KEPT:
            self[text] = data
        return data

    def learn(self, texts: Iterable[str]) -> None:
        """Check and encode these now (the tags a role declares), so its frames only look them up."""
        for text in texts:
            if text not in self:
                self.__missing__(text)


_KEPT = 4096
NAMES = _Names()


def encode(envelope: Envelope) -> bytes:
    src, dst, tag = NAMES[envelope.src], NAMES[envelope.dst], NAMES[envelope.tag]
    header = _HEADER.pack(MAGIC, int(envelope.kind), MORE if envelope.more else 0, len(src), len(dst), len(tag))
    return b"".join((header, src, dst, tag, envelope.payload))


def decode(data: bytes) -> Envelope:
    """Parse one envelope; anything else is a `ProtocolError` (nothing is ever unpickled)."""
    if not isinstance(data, bytes) or len(data) < _HEADER.size:
        raise ProtocolError("envelope: shorter than its header")
    magic, kind, flags, n_src, n_dst, n_tag = _HEADER.unpack_from(data)
    if magic != MAGIC or kind not in {int(k) for k in Kind} or flags & ~MORE:
        raise ProtocolError("envelope: not a FALSE-VFL link message (bad magic, kind or flags)")
    end = _HEADER.size + n_src + n_dst + n_tag
    if end > len(data):
        raise ProtocolError("envelope: its names run past its end")
    try:
        names = data[_HEADER.size:end].decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("envelope: names are not ASCII") from None
    src, dst, tag = names[:n_src], names[n_src:n_src + n_dst], names[n_src + n_dst:]
    return Envelope(Kind(kind), src, dst, tag, data[end:], bool(flags & MORE))


def fragments(kind: Kind, src: str, dst: str, tag: str, payload: bytes) -> list[bytes]:
    """The encoded envelopes that carry one frame (one when it fits, consecutive fragments otherwise), as
    `encode` writes each: the header and names once, then each fragment's flag and bytes."""
    size = len(payload)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"a frame of {size} bytes exceeds the bound of {MAX_FRAME_BYTES} bytes")
    parts = NAMES[src], NAMES[dst], NAMES[tag]
    names, lengths = b"".join(parts), tuple(map(len, parts))
    view, out = memoryview(payload), []
    for start in range(0, max(size, 1), FRAGMENT_BYTES):
        more = MORE if start + FRAGMENT_BYTES < size else 0
        out.append(b"".join((_HEADER.pack(MAGIC, int(kind), more, *lengths), names,
                             view[start:start + FRAGMENT_BYTES])))
    return out


class Reassembly:
    """Joins the fragments of frames per sender; refuses a frame as soon as it grows past its bound."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[str, list[bytes], int]] = {}

    def add(self, envelope: Envelope, limit: int = MAX_FRAME_BYTES) -> Envelope | None:
        """The whole frame once its last fragment arrived, else None; `limit` is the tag's bound in bytes."""
        tag, parts, size = self._open.pop(envelope.src, (envelope.tag, [], 0))
        if tag != envelope.tag:  # the link's peer answers for it: a relay refuses a sender's interleaving itself
            raise ProtocolError(f"envelope: {envelope.src} interleaved frame {envelope.tag!r} into {tag!r}")
        size += len(envelope.payload)
        if size > min(limit, MAX_FRAME_BYTES):
            raise Refused(f"a frame {tag!r} over its bound of {min(limit, MAX_FRAME_BYTES)} bytes", envelope.src)
        parts.append(envelope.payload)
        if envelope.more:
            self._open[envelope.src] = (tag, parts, size)
            return None
        payload = parts[0] if len(parts) == 1 else b"".join(parts)
        return Envelope(envelope.kind, envelope.src, envelope.dst, tag, payload)

    def starts(self, envelope: Envelope) -> bool:
        """Whether the envelope is a frame's first fragment (nothing of its sender's is being joined)."""
        return envelope.src not in self._open

    def forget(self, src: str) -> None:
        """Drop a sender's unfinished frame (a lost party's earlier process)."""
        self._open.pop(src, None)
