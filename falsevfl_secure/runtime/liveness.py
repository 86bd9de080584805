"""Liveness and diagnosis: every role's heartbeat and final status, kept in the rendezvous store.

A role's heartbeat thread bumps its counter in the store every second and notes the round the role is
in. A role whose counter stops for `STALL_S` is stalled (stopped, hung, or gone): the launcher (and, one
host per party, every peer) ends the run naming it. A role that is merely slow keeps beating, so it is
never declared dead; gloo's own collective timeout is long (`COLLECTIVE_TIMEOUT_S`) and only a deadlock
reaches it. A role that fails writes its own status (its error and the round) before it exits, so the
report names the cause, not the peers' timeouts that followed it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

HEARTBEAT_S = 1.0
STALL_S = 10.0
STARTUP_S = 180.0  # a role that never beat: importing torch on a loaded machine takes a while
COLLECTIVE_TIMEOUT_S = 900
STORE_TIMEOUT = timedelta(seconds=30)


def connect_store(address: str, port: int, host: bool = False) -> dist.TCPStore:
    """The rendezvous store at address:port; `host` serves it from this process."""
    return dist.TCPStore(address, port, None, host, timeout=STORE_TIMEOUT, wait_for_workers=False)


def beats(store: dist.TCPStore, rank: int) -> int:
    return int(store.add(f"alive/{rank}", 0))  # add 0: a read that never blocks


def last_round(store: dist.TCPStore, rank: int) -> str | None:
    key = f"round/{rank}"
    return store.get(key).decode() if store.check([key]) else None


def report_status(store: dist.TCPStore, rank: int, outcome: str, message: str, round_name: str | None) -> None:
    """Record how this role ended: "ok", "error" (its own input or a bug), or "failure" (a peer's)."""
    record = {"outcome": outcome, "message": message, "round": round_name, "at": time.time()}
    store.set(f"status/{rank}", json.dumps(record))


def read_status(store: dist.TCPStore, rank: int) -> dict | None:
    key = f"status/{rank}"
    return json.loads(store.get(key)) if store.check([key]) else None


class Heartbeat:
    """This role's heartbeat thread; with `watch`, it also watches its peers and calls `on_stall(message)`
    when one stops (one host per party: nobody else would notice)."""

    def __init__(self, address: str, port: int, rank: int, world_size: int, watch: bool = False,
                 on_stall: Callable[[str], None] | None = None) -> None:
        self.store = connect_store(address, port)  # a connection of its own: the main thread may be blocked
        self.rank, self.world_size, self.watch, self.on_stall = rank, world_size, watch, on_stall
        self.round: str | None = None
        self._stop = threading.Event()
        self._monitor = StallMonitor(world_size, exclude=rank)
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def enter(self, round_name: str) -> None:
        """Called by the transport at every round: the round a stall would be reported in."""
        if round_name != self.round:
            self.round = round_name
            self.store.set(f"round/{self.rank}", round_name)

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.store.add(f"alive/{self.rank}", 1)
                stalled = [s.describe() for s in self._monitor.update(self.store)] if self.watch else []
            except (RuntimeError, dist.DistStoreError) as error:  # the store's host is gone
                stalled = [f"the rendezvous store stopped answering ({str(error).splitlines()[0][:120]})"]
            if stalled and self.on_stall is not None:
                self.on_stall("; ".join(stalled))
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * HEARTBEAT_S)


@dataclass
class _Seen:
    count: int = 0
    since: float = 0.0


@dataclass(frozen=True)
class Stall:
    rank: int
    seconds: float
    round: str | None

    def describe(self, name: str = "") -> str:
        where = f" in round {self.round!r}" if self.round else ""
        named = f" ({name})" if name else ""
        return f"rank {self.rank} stalled (no heartbeat for {self.seconds:.0f} s){where}{named}"


class StallMonitor:
    """Which roles have not beaten for `STALL_S` (or never, within `STARTUP_S`)."""

    def __init__(self, world_size: int, exclude: int | None = None) -> None:
        now = time.monotonic()
        self.seen = {r: _Seen(0, now) for r in range(world_size) if r != exclude}

    def update(self, store: dist.TCPStore, alive: Callable[[int], bool] = lambda rank: True) -> list[Stall]:
        now, stalled = time.monotonic(), []
        for rank, seen in self.seen.items():
            count = beats(store, rank)
            if count != seen.count:
                seen.count, seen.since = count, now
            limit = STALL_S if seen.count else STARTUP_S
            if now - seen.since > limit and alive(rank) and read_status(store, rank) is None:
                stalled.append(Stall(rank, now - seen.since, last_round(store, rank)))
        return stalled


def await_statuses(store: dist.TCPStore, world_size: int, timeout_s: float = 60.0) -> None:
    """Wait until every role has reported how it ended (the store's host leaves last)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(read_status(store, r) is None for r in range(world_size)):
        time.sleep(0.2)


def exit_now(code: int) -> None:
    """Leave at once from any thread (a blocked collective cannot be interrupted otherwise)."""
    os._exit(code)
