"""The interface of a point-to-point byte channel between the ranks of one world.

The secure protocols that exchange byte frames (the record alignment, the he ciphertexts) are written
against it; `transport.channel.PairChannel` realises it over the run's authenticated links.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Channel(Protocol):
    """Reliable, ordered byte frames between the ranks of one world. A realisation that seals frames binds its
    nonces to the key, not to the channel object: several channels of one world never repeat a (key, nonce)."""

    rank: int
    world_size: int

    def send(self, dst: int, payload: bytes) -> None:
        """Deliver `payload` to rank `dst` (frames between two ranks arrive in order)."""

    def recv(self, src: int) -> bytes:
        """The next frame from rank `src` (blocks until it arrives)."""

    def exchange(self, dst: int, payload: bytes, src: int) -> bytes:
        """Send `payload` to `dst` while receiving the next frame from `src`; deadlock-free in a ring."""
