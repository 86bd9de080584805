"""Test-only channels for the private record alignment (`falsevfl_secure.secure.align`).

`MemoryWorld`: K ranks in one process, one thread each, one queue per ordered pair of ranks; it
carries any Python object, so a test can hand a party something that is not bytes.
`gloo_worker`: one real party process (spawned) aligning over `GlooChannel`.
Neither imports torch at module level, so a spawned child starts from a light module.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable, Sequence


class MemoryChannel:
    """One rank's end of a `MemoryWorld` (implements `falsevfl_secure.transport.channel.Channel`)."""

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


def gloo_worker(rank: int, size: int, port: int, ids: list[str], active: int, results) -> None:
    """One party process: align over gloo (full union, restricted, and ranks 1 and 2 alone on a
    subgroup), then check that a frame announcing 2 GiB is refused before allocation; puts
    (rank, dict) on `results`, with
    "error" set if anything failed (so the parent never waits for a child that is gone)."""
    try:
        results.put((rank, _gloo_party(rank, size, port, ids, active)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent instead of a silent exit
        results.put((rank, {"error": repr(exc)}))


def _gloo_party(rank: int, size: int, port: int, ids: list[str], active: int) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    from falsevfl_secure.secure.align import align
    from falsevfl_secure.transport.channel import FrameTooLargeError, GlooChannel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=30))
    try:
        channel = GlooChannel()
        full = align(channel, ids, active)
        restricted = align(channel, ids, active, restrict_to_active=True)
        pair = dist.new_group([1, 2])  # every rank must call new_group; group ranks 0, 1 are global 1, 2
        sub = _plain(align(GlooChannel(pair), ids, 0)) if rank in (1, 2) else None
        refused = None
        if rank == 0:
            dist.send(torch.tensor([1 << 31], dtype=torch.int64), 1)
        elif rank == 1:
            try:
                channel.recv(0)
            except FrameTooLargeError as exc:
                refused = str(exc)
        return {"full": _plain(full), "restricted": _plain(restricted), "subgroup": sub, "refused": refused,
                "sent": channel.bytes_sent, "received": channel.bytes_received}
    finally:
        dist.destroy_process_group()


def collect(procs, results, timeout: float) -> dict:
    """{rank: dict} from every child; fails fast when a child exits without reporting."""
    import queue as queue_module
    import time

    out: dict = {}
    deadline = time.monotonic() + timeout
    while len(out) < len(procs) and time.monotonic() < deadline:
        try:
            rank, report = results.get(timeout=0.5)
            out[rank] = report
            assert "error" not in report, f"party {rank}: {report['error']}"
        except queue_module.Empty:
            gone = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out]
            assert not gone, f"party processes {gone} exited with codes {[procs[i].exitcode for i in gone]}"
    assert len(out) == len(procs), f"only ranks {sorted(out)} reported within {timeout} s"
    return out


def _plain(result) -> dict:
    """An `Alignment` as plain lists (what crosses the process boundary)."""
    holders = None if result.holders is None else result.holders.tolist()
    return {"n_union": result.n_union, "positions": result.positions.tolist(), "holders": holders}
