"""Test-only channels for the private record alignment (`falsevfl_secure.secure.align`).

`MemoryWorld`: K ranks in one process, one thread each, one queue per ordered pair of ranks; it
carries any Python object, so a test can hand a party something that is not bytes. Real processes over
the authenticated links run through `runtime.world.run_world` (tests/test_align.py).
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable, Sequence


class MemoryChannel:
    """One rank's end of a `MemoryWorld` (implements `falsevfl_secure.network.channel.Channel`)."""

    def __init__(self, world: MemoryWorld, rank: int) -> None:
        self.world, self.rank, self.world_size = world, rank, world.size
        self.bytes_sent = self.bytes_received = 0

    def send(self, dst: int, payload) -> None:
        self.bytes_sent += len(payload) if isinstance(payload, bytes) else 0
        self.world.queues[self.rank, dst].put(payload)

    def recv(self, src: int):
        try:
            payload = self.world.queues[src, self.rank].get(timeout=self.world.timeout)
        except queue.Empty:
            raise TimeoutError(f"rank {self.rank}: nothing from rank {src} in {self.world.timeout} s") from None
        self.bytes_received += len(payload) if isinstance(payload, bytes) else 0
        return payload

    def exchange(self, dst: int, payload, src: int):
        self.send(dst, payload)  # queues are unbounded: sending never blocks, so a ring cannot deadlock
        return self.recv(src)


class MemoryWorld:
    """K in-memory ranks; `run` calls one function per rank on its own thread."""

    def __init__(self, size: int, timeout: float = 10.0) -> None:
        self.size, self.timeout = size, timeout
        self.queues = {(s, d): queue.Queue() for s in range(size) for d in range(size) if s != d}

    def channel(self, rank: int) -> MemoryChannel:
        return MemoryChannel(self, rank)

    def pending(self) -> int:
        """Frames sent but not yet received (0 after a clean run, or when nothing was sent)."""
        return sum(q.qsize() for q in self.queues.values())

    def run(self, fns: Sequence[Callable[[MemoryChannel], object]]) -> list:
        """Each rank's return value, or the exception it raised."""
        results: list = [None] * self.size

        def body(rank: int) -> None:
            try:
                results[rank] = fns[rank](self.channel(rank))
            except BaseException as exc:  # noqa: BLE001 - handed back to the test
                results[rank] = exc

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=self.timeout * 6)
        assert not any(t.is_alive() for t in threads), "a rank is still running"
        return results


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of asking."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain(result) -> dict:
    """An `Alignment` as plain lists (what crosses the process boundary)."""
    holders = None if result.holders is None else result.holders.tolist()
    return {"n_union": result.n_union, "positions": result.positions.tolist(), "holders": holders}
