"""Starting the role processes of a world on this machine, watching them, and naming what went wrong.

The launcher serves the rendezvous store itself, so a stopped worker cannot freeze it. It ends the run at
the first failure: a role that exits with its own error, a role that dies, or a role whose heartbeat
stops (`liveness`). It then names the cause -- the role's own message, not the timeouts its peers saw
afterwards -- stops every worker, and never leaves one behind, also on Ctrl-C or a timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import PartyFailure
from . import liveness

SETTLE_S = 2.0  # after a first failure, how long the other roles get to report theirs


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class World:
    """The worker processes of one run and the store they rendezvous at."""

    procs: list[subprocess.Popen]
    store: object
    names: list[str]
    out_dir: Path

    def codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]


def launch(argv: list[list[str]], out_dir: Path, names: list[str], env: dict[int, dict] | None = None,
           show_rank: int | None = None, timeout_s: float | None = None) -> None:
    """Run `python ARGV[r]` as every rank r (ARGV[r] starts with "-m MODULE") and wait for all of them.

    The launcher serves the rendezvous store (MASTER_ADDR, MASTER_PORT in every rank's environment). Each
    worker's output goes to OUT/rank<r>.log (`show_rank`'s stderr goes to the terminal: its progress bars).
    `env` adds per-rank variables. Raises `PartyFailure` naming the role that failed first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    store = liveness.connect_store("127.0.0.1", 0, host=True)
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "WORLD_SIZE": str(len(argv)),
            "FALSEVFL_LAUNCHER_PID": str(os.getpid()), "OMP_NUM_THREADS": "1"}
    world = World([], store, names, out_dir)
    try:
        _spawn(world, argv, base, env or {}, show_rank)
        _wait(world, timeout_s)
    finally:
        _reap(world.procs)


def _spawn(world: World, argv: list[list[str]], base: dict, env: dict[int, dict], show_rank: int | None) -> None:
    """Start every rank with Ctrl-C held: interrupted inside a Popen, the launcher would lose track of a
    worker that already runs. The workers keep SIGINT blocked (inherited), so a terminal Ctrl-C is acted
    on by the launcher alone, which then stops every worker."""
    held = _hold_sigint()
    try:
        for rank, args in enumerate(argv):
            with open(world.out_dir / f"rank{rank}.log", "w") as log:  # the child keeps its own descriptor
                world.procs.append(subprocess.Popen(
                    [sys.executable, *args], env={**base, **env.get(rank, {}), "RANK": str(rank)}, stdout=log,
                    stderr=None if rank == show_rank else subprocess.STDOUT))
    finally:
        _release_sigint(held)


def _wait(world: World, timeout_s: float | None) -> None:
    """Until every worker exits 0; the first failure ends the run with a diagnosis."""
    monitor, start, last_check = liveness.StallMonitor(len(world.procs)), time.monotonic(), 0.0
    while True:
        codes = world.codes()
        if all(c == 0 for c in codes):
            return
        stalled = []
        if time.monotonic() - last_check >= liveness.HEARTBEAT_S:
            last_check = time.monotonic()
            stalled = monitor.update(world.store, alive=lambda r: world.procs[r].poll() is None)
        if stalled or any(c not in (None, 0) for c in codes):
            raise PartyFailure(diagnose(world, stalled))
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise PartyFailure(f"the run did not finish within {timeout_s} s")
        time.sleep(0.1)


def diagnose(world: World, stalled: list[liveness.Stall]) -> str:
    """Name the cause: a role's own error first, then a death, then a stall, then anything else."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and not _own_errors(world):
        time.sleep(0.1)
    codes = world.codes()
    errors = _own_errors(world)
    if errors:
        rank, status = min(errors.items(), key=lambda kv: kv[1]["at"])
        return f"rank {rank} failed{_where(status.get('round'))} ({world.names[rank]}): {status['message']}"
    for rank, code in enumerate(codes):
        if code is not None and code < 0 and liveness.read_status(world.store, rank) is None:
            where = _where(liveness.last_round(world.store, rank))
            return f"rank {rank} died (signal {-code}){where} ({world.names[rank]})"
    if stalled:
        return stalled[0].describe(world.names[stalled[0].rank])
    return _other_failure(world, codes)


def _own_errors(world: World) -> dict[int, dict]:
    statuses = {r: liveness.read_status(world.store, r) for r in range(len(world.procs))}
    return {r: s for r, s in statuses.items() if s is not None and s["outcome"] == "error"}


def _where(round_name: str | None) -> str:
    return f" in round {round_name!r}" if round_name else " outside the rounds (start-up or shut-down)"


def _other_failure(world: World, codes: list[int | None]) -> str:
    rank = next((r for r, c in enumerate(codes) if c not in (None, 0)), 0)
    status = liveness.read_status(world.store, rank)
    if status is not None:
        return f"rank {rank} failed{_where(status.get('round'))} ({world.names[rank]}): {status['message']}"
    log = (world.out_dir / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
    return f"rank {rank} exited with code {codes[rank]} ({world.names[rank]}): {log[-1][:300] if log else ''}"


def _hold_sigint() -> bool:
    """Block SIGINT for this thread (main thread only, POSIX); True when it was blocked here."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        return False
    return signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _release_sigint(held: bool) -> None:
    """Unblock SIGINT again; one that came in the meantime is delivered now (KeyboardInterrupt)."""
    if held:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _reap(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM every worker still running, then SIGKILL any that outlives the grace period."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
