"""The one way this package starts the roles of a run on one machine: `World`.

A world starts one process per role from a fork server (a fresh process that imports torch once, so a
role starts in a fraction of a second and never inherits the caller's threads or locks). Each child runs
`worker.serve_in_world`: it opens its hub and reports the port, receives the address book (every hub's
`127.0.0.1:port`), joins over the authenticated links and runs its program. The world then waits for
every outcome, or for the first failure: it names the cause -- a role's own error first, then a role
that died (with its signal and the round it was in), then a stall -- not the peers' failures that
followed, and it stops every child (also on Ctrl-C and on a timeout). Children write their output to
`OUT/logs/<role>.log` (one chosen role's stderr stays on the terminal: its progress bars), and their
process ids to `OUT/world.pids`. A child never outlives the world, even one killed with SIGKILL: each child
watches a lifeline, a pipe whose only writing end this process holds, and exits when it reads end-of-file
(the kernel closes that end when this process dies). The fork server and the resource tracker then lose
their last client and exit too. (A parent-death signal would not do: a child's parent is the fork server,
which lives on as long as any child holds its pipe.)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import PartyFailure
from ..fsio import atomic_write
from . import codec
from .role import RoleSpec
from .worker import serve_in_world

SETTLE_S = 2.0  # after a first failure, how long the other roles get to report theirs
GROUP_S = 0.5  # after the first role's own error, how long the others' are read for the same one
STOP_GRACE_S = 5.0
LAUNCHER_GONE = 137  # a child's exit code when its launcher is gone (as if killed with it)


class World:
    """`World(specs, program, args, out_dir).start()`, then `wait()` (or `ask`/`answer` for sessions)."""

    def __init__(self, specs: Sequence[RoleSpec], program: Callable, args: tuple = (), out_dir: Path | None = None,
                 show: str | None = None, per_role: dict[str, tuple] | None = None,
                 role_classes: dict[str, type] | None = None, via: dict[str, str] | None = None) -> None:
        self.specs, self.program, self.args = list(specs), program, tuple(args)
        self.role_classes = role_classes or {}  # tests: a weakened or malicious participant's class
        self.via = via or {}  # tests: dial these roles at these addresses instead (e.g. a capturing proxy)
        self.per_role = per_role or {}  # extra arguments handed to one role's process alone (e.g. a test secret)
        self.names = [s.name for s in self.specs]
        self.out_dir, self.show = (Path(out_dir) if out_dir is not None else None), show
        self.procs: list = []
        self.conns: list = []
        self.lifelines: list = []  # the writing ends: never written, closed only when this world is over
        self.reports: dict[int, dict] = {}
        self.book: dict[str, str] = {}  # every hub's address (a role that rejoins gets it too)

    def start(self) -> World:
        for spec in self.specs:
            proc, conn, held = self._spawn(spec, (*self.args, *self.per_role.get(spec.name, ())))
            self.procs.append(proc)
            self.conns.append(conn)
            self.lifelines.append(held)
        try:
            for proc in self.procs:
                proc.start()
            self._write_pids()
            ports = {self.names[r]: self._next(r, "port", 180.0)["port"] for r in range(len(self.procs))}
            self.book = {name: f"127.0.0.1:{port}" for name, port in ports.items() if port}
            if self.out_dir is not None:
                atomic_write(self.out_dir / "world.addresses", json.dumps(self.book))
            for conn in self.conns:
                conn.send_bytes(codec.pack({"addresses": {**self.book, **self.via}}))
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, spec: RoleSpec, args: tuple) -> tuple:
        """A role's process (not started), the parent's end of its pipe and the lifeline's writing end."""
        ctx = _context()
        parent, child = ctx.Pipe()
        watched, held = ctx.Pipe(duplex=False)
        log = None if self.out_dir is None else str(self.out_dir / "logs" / f"{spec.name}.log")
        proc = ctx.Process(target=_child, args=(spec, self.program, args, child, watched, log, spec.name == self.show,
                                                self.role_classes.get(spec.name)), daemon=True)
        return proc, parent, held

    def rejoin(self, name: str, args: tuple) -> None:
        """Start role `name` again, asking to rejoin (a party that left a run that went on comes back, as
        `federation train --rejoin` does): a fresh process with `args`; its outcome replaces the old one's."""
        rank = self.names.index(name)
        spec = self.specs[rank]
        spec = replace(spec, request=replace(spec.request, rejoin=True))
        proc, conn, held = self._spawn(spec, args)
        self.procs[rank], self.conns[rank] = proc, conn
        self.lifelines.append(held)
        self.reports.pop(rank, None)
        proc.start()
        self._write_pids()
        self._next(rank, "port", 180.0)
        conn.send_bytes(codec.pack({"addresses": {**self.book, **self.via}}))

    def _write_pids(self) -> None:
        if self.out_dir is not None:
            atomic_write(self.out_dir / "world.pids", json.dumps({n: p.pid for n, p in zip(self.names, self.procs,
                                                                                         strict=True)}))

    def _next(self, rank: int, key: str, timeout_s: float) -> dict:
        """The next record from role `rank`, which must hold `key`; a failure raises `PartyFailure`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.conns[rank].poll(0.1):
                record = codec.unpack(self.conns[rank].recv_bytes())
                if key in record:
                    return record
                self.reports[rank] = record
                raise PartyFailure(self.diagnose())
            if self.procs[rank].exitcode is not None and not self.conns[rank].poll(0.2):
                raise PartyFailure(self.diagnose())
        raise PartyFailure(f"{self.names[rank]} did not answer within {timeout_s:.0f} s")

    def ask(self, rank: int, record: dict) -> None:
        self.conns[rank].send_bytes(codec.pack(record))

    def answer(self, rank: int, key: str, timeout_s: float) -> object:
        return self._next(rank, key, timeout_s)[key]

    def outcomes(self, timeout_s: float = 120.0) -> list[dict]:
        """Every role's own record (`{"ok": ...}` or its error report) once all have ended or died (no failure
        is raised: the attack tests read how each role ended)."""
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and any(
                    r not in self.reports and p.exitcode is None for r, p in enumerate(self.procs)):
                self._collect()
            self._collect(0.5)
            return [self.reports.get(r, {"error": f"exit code {p.exitcode}", "outcome": "died"})
                    for r, p in enumerate(self.procs)]
        finally:
            self.stop()

    def wait(self, timeout_s: float | None = None) -> list[object]:
        """Every role's value (by rank) once all have finished; the first failure raises `PartyFailure`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while len(self.reports) < len(self.procs):
                self._collect()
                if any("error" in r for r in self.reports.values()) or self._died():
                    raise PartyFailure(self.diagnose())
                if deadline is not None and time.monotonic() > deadline:
                    raise PartyFailure(f"the run did not finish within {timeout_s} s")
            return [self.reports[r]["ok"] for r in range(len(self.procs))]
        finally:
            self.stop()

    def _collect(self, wait_s: float = 0.1) -> None:
        ready = multiprocessing.connection.wait([c for r, c in enumerate(self.conns) if r not in self.reports],
                                                timeout=wait_s)
        for rank, conn in enumerate(self.conns):
            if conn in ready and rank not in self.reports:
                self._read(rank)

    def _read(self, rank: int) -> None:
        try:
            self.reports[rank] = codec.unpack(self.conns[rank].recv_bytes())
        except (EOFError, OSError):
            pass  # it died; `_died` sees its exit code

    def _died(self) -> bool:
        """A role whose process ended without a report (a report still in its pipe is read first)."""
        for rank, proc in enumerate(self.procs):
            if proc.exitcode is not None and rank not in self.reports:
                if self.conns[rank].poll(0.2):
                    self._read(rank)
                if rank not in self.reports:
                    return True
        return False

    def diagnose(self) -> str:
        """Name the cause: a role's own error first, then a death, then a stall, then anything else."""
        settle = time.monotonic() + SETTLE_S
        while time.monotonic() < settle and not self._own_errors():
            self._collect()
        # a condition every party finds (IDs that do not line up) reaches them within moments of each other: the
        # others' reports are read too, briefly, so that the report names them all (a trial read one party's fault)
        grouped = time.monotonic() + GROUP_S
        while self._own_errors() and time.monotonic() < grouped and self._still_running():
            self._collect()
        return describe(self.names, self.reports, {r: p.exitcode for r, p in enumerate(self.procs)})

    def _still_running(self) -> bool:
        return any(r not in self.reports and p.exitcode is None for r, p in enumerate(self.procs))

    def _own_errors(self) -> bool:
        return any(r.get("outcome") in ("error", "crash") for r in self.reports.values())

    def stop(self) -> None:
        """Stop every child still running (SIGTERM, then SIGKILL after a grace period) and reap them all."""
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            if proc.pid is None:
                continue  # start() failed before this one began: nothing to reap
            proc.join(max(0.05, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for held in self.lifelines:
            held.close()  # the world is over: a child not reaped yet (a kill still pending) exits too


def describe(names: list[str], reports: dict[int, dict], codes: dict[int, int | None]) -> str:
    """The one line that names why a world failed (see `World.diagnose`)."""
    own = sorted((r["at"], rank) for rank, r in reports.items() if r.get("outcome") in ("error", "crash"))
    if own:
        rank = own[0][1]
        return f"{_who(names, reports, [r for _, r in own], rank)} failed{_where(reports[rank].get('round'))}: " \
               f"{reports[rank]['error']}"
    blames = [r["blame"] for r in reports.values() if r.get("blame")]
    for rank, code in codes.items():
        if code is not None and code < 0 and rank not in reports:
            round_ = next((b["round"] for b in blames if b["role"] == names[rank]), None)
            return f"{names[rank]} died (signal {-code}){_where(round_)}"
    for blame in blames:
        if blame["role"] in names and blame["how"] == "stalled":
            rank = names.index(blame["role"])
            return f"{names[rank]} stalled (no heartbeat for {_stall_s():.0f} s){_where(blame['round'])}"
    failed = sorted((r["at"], rank) for rank, r in reports.items() if "error" in r)
    if failed:
        rank = failed[0][1]
        return f"{names[rank]} failed: {reports[rank]['error']}"
    rank = next((r for r, c in codes.items() if c not in (None, 0)), 0)
    return f"{names[rank]} exited with code {codes.get(rank)} without a report"


def _who(names: list[str], reports: dict[int, dict], failed: list[int], first: int) -> str:
    """The first role to fail, or all that failed with its error (a condition every party finds, such as IDs that do
    not line up: a trial's report named one party as if the fault were its own)."""
    same = sorted(r for r in failed if reports[r]["error"] == reports[first]["error"])
    if len(same) == 1:
        return names[first]
    return "every role" if len(same) == len(names) else ", ".join(names[r] for r in same) + " each"


def _where(round_name: str | None) -> str:
    from ..network.network import where_in_run

    return where_in_run(round_name)


def _stall_s() -> float:
    from ..network.network import STALL_S

    return STALL_S


# What every role imports anyway, imported once by the fork server: torch (and torch._dynamo, which the first
# optimiser pulls in: 3 s per process otherwise), scikit-learn's loaders, and this package's runtime.
PRELOAD = ["torch", "torch._dynamo", "sklearn.datasets", "sklearn.model_selection", "falsevfl_secure.runtime.world",
           "falsevfl_secure.runtime.distributed"]


def _context():
    """Never a plain fork of the caller: its threads (links, thread pools) may hold locks the child would
    wait on forever. The fork server is a fresh process that imports torch once."""
    # joblib (under scikit-learn) probes multiprocessing with a named semaphore at import; made in the fork
    # server, it outlives its name and the resource tracker warns at exit. Nothing here uses joblib's processes.
    os.environ.setdefault("JOBLIB_MULTIPROCESSING", "0")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _child(spec: RoleSpec, program: Callable, args: tuple, conn, lifeline, log: str | None, show: bool,
           role_class: type | None) -> None:
    """A world's child: its lifeline watched, its output to its log (the shown role keeps its stderr), then
    the role's life."""
    follow_launcher(lifeline)
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)  # (a planted link: refused)
        os.dup2(fd, 1)
        if not show:
            os.dup2(fd, 2)
        os.close(fd)
    # the shown role's error goes to its log only: the launcher's summary gives it on the terminal (it came twice)
    serve_in_world(spec, program, args, conn, role_class, errors=sys.stdout if show and log is not None else None)


def follow_launcher(lifeline) -> None:
    """Exit as soon as the lifeline reads end-of-file: nothing is ever written to it, so that means the
    launcher died or its world is over (also when it died before this thread started: no race)."""
    def watch() -> None:
        try:
            lifeline.recv_bytes()
        except (EOFError, OSError):
            pass
        os._exit(LAUNCHER_GONE)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


class WorkerError(RuntimeError):
    """A role of `run_world` raised, died or missed the deadline; the message names the role."""


def run_world(protocol, parties: int, fn: Callable, args: Sequence = (), timeout_s: float = 120.0,
              active_index: int = -1, record: bool = False, out_dir: Path | None = None,
              role_classes: dict[str, type] | None = None, consent: bool = True) -> list[object]:
    """``fn(role, *args)`` in every role of a fresh local world of `parties` parties (names party0, ...;
    then the protocol's helpers); the return values by rank (tests and benchmarks of the building blocks).
    `fn` must be importable by name (a module-level function)."""
    import tempfile

    from ..transport.protocols import protocol_named
    from .cast import local_specs

    proto = protocol_named(protocol)
    names = [f"party{k}" for k in range(parties)]
    with tempfile.TemporaryDirectory(prefix="falsevfl-keys-") as keys:
        specs = local_specs(proto, names, names[active_index % parties], Path(keys), {"command": "test"},
                            consent=consent, record=record)
        world = World(specs, fn, tuple(args), out_dir, role_classes=role_classes)
        try:
            return world.start().wait(timeout_s)
        except PartyFailure as error:
            raise WorkerError(str(error)) from None
