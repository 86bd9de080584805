"""Point-to-point byte channels between role processes (the alignment, the he frames).

`Channel` (in `secure.channel`, where the protocols that use it live) is the interface: ranks
0..world_size-1, blocking `send`/`recv` of opaque byte frames, and `exchange` (send to one rank while
receiving from another, deadlock-free when every rank of a ring calls it at once). `GlooChannel` realises it over an
already initialised torch.distributed process group (gloo): every frame is its length as one int64
tensor, then (if non-empty) its bytes as one uint8 tensor. A received length above `max_frame`
is refused before anything is allocated. Frames are bytes only: nothing is ever unpickled.
"""

from __future__ import annotations

from ..secure.channel import Channel
from ..secure.errors import SecureMessageError

__all__ = ["MAX_FRAME_BYTES", "Channel", "FrameTooLargeError", "GlooChannel"]

MAX_FRAME_BYTES = 1 << 30  # 1 GiB: about 33 million ristretto255 points


class FrameTooLargeError(SecureMessageError):
    """A peer announced (or a caller tried to send) a frame longer than the channel's bound."""


class GlooChannel:
    """`Channel` over torch.distributed point-to-point ops (gloo), with byte counters."""

    def __init__(self, group=None, max_frame: int = MAX_FRAME_BYTES) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise SecureMessageError("GlooChannel needs torch.distributed initialised (init_process_group) first")
        self._dist, self._group, self.max_frame = dist, group, int(max_frame)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.bytes_sent = self.bytes_received = 0

    def _global(self, rank: int) -> int:
        """The global rank of a rank of this channel's group (torch p2p ops take global ranks)."""
        if not 0 <= rank < self.world_size or rank == self.rank:
            raise SecureMessageError(f"rank {self.rank}: no channel to rank {rank} (world size {self.world_size})")
        return rank if self._group is None else self._dist.get_global_rank(self._group, rank)

    def _tensors(self, payload: bytes):
        """(length tensor, data tensor or None) for one outgoing frame."""
        import torch

        if not isinstance(payload, bytes | bytearray):
            raise SecureMessageError(f"a frame must be bytes, got {type(payload).__name__}")
        if len(payload) > self.max_frame:
            raise FrameTooLargeError(f"frame of {len(payload)} bytes exceeds the bound of {self.max_frame} bytes")
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else None
        self.bytes_sent += 8 + len(payload)
        return torch.tensor([len(payload)], dtype=torch.int64), data

    def _length(self, header, src: int) -> int:
        """The announced length, refused above the bound (before the payload buffer exists)."""
        length = int(header.item())
        if not 0 <= length <= self.max_frame:
            raise FrameTooLargeError(f"rank {self.rank}: rank {src} announced a frame of {length} bytes "
                                     f"(bound {self.max_frame})")
        return length

    def send(self, dst: int, payload: bytes) -> None:
        """Length, then bytes, to `dst` (blocking)."""
        peer = self._global(dst)
        header, data = self._tensors(payload)
        self._dist.send(header, peer, group=self._group)
        if data is not None:
            self._dist.send(data, peer, group=self._group)

    def recv(self, src: int) -> bytes:
        """Length, then bytes, from `src` (blocking)."""
        import torch

        peer, header = self._global(src), torch.empty(1, dtype=torch.int64)
        self._dist.recv(header, peer, group=self._group)
        length = self._length(header, src)
        self.bytes_received += 8 + length
        if length == 0:
            return b""
        data = torch.empty(length, dtype=torch.uint8)
        self._dist.recv(data, peer, group=self._group)
        return data.numpy().tobytes()

    def exchange(self, dst: int, payload: bytes, src: int) -> bytes:
        """Post the sends to `dst` (non-blocking), receive from `src`, then wait for the sends to complete."""
        peer = self._global(dst)
        header, data = self._tensors(payload)
        pending = [self._dist.isend(header, peer, group=self._group)]
        if data is not None:
            pending.append(self._dist.isend(data, peer, group=self._group))
        frame = self.recv(src)  # on a refused frame the sends are left pending: the world is torn down anyway
        for work in pending:
            work.wait()
        return frame
