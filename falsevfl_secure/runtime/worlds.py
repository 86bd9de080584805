"""Run one function in every role of a fresh world of local processes (tests and benchmarks of the
secure building blocks), through the same `runtime.role.joined` path as every other role.

`run_world(protocol, parties, fn)` starts `protocol.world_size(parties)` processes; each joins the world
and calls ``fn(role, *args)``; their return values (dicts, lists, numbers, strings, numpy arrays) come
back by rank as fixed-schema bytes. A role that raises, dies or misses the deadline ends the call with a
`WorkerError` naming the rank that failed first; every process started here is reaped.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..transport.protocols import Protocol, protocol_named
from . import codec, liveness
from .role import Role, RoleSpec, joined

_FAILURE_GRACE_S = 2.0


class WorkerError(RuntimeError):
    """A role of `run_world` raised, died or missed the deadline; the message names the rank."""


def _role(spec: RoleSpec, fn: Callable, args: tuple, conn) -> None:
    import torch

    torch.set_num_threads(1)
    reported = False
    try:
        with joined(spec) as role:
            try:
                value = fn(role, *args)
            except BaseException as error:
                reported = _report(conn, error)  # before the teardown closes the connections peers wait on
                raise
        conn.send_bytes(codec.pack({"ok": value, "at": time.monotonic()}))
    except BaseException as error:
        if not reported:
            _report(conn, error)


def _report(conn, error: BaseException) -> bool:
    """Send the failure with the time it happened: the parent names the earliest as the cause."""
    text = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    conn.send_bytes(codec.pack({"error": text, "at": time.monotonic()}))
    return True


def run_world(protocol: str | Protocol, parties: int, fn: Callable[..., Any], args: Sequence = (),
              timeout_s: float = 120.0, active_index: int = -1, start_method: str = "forkserver") -> list[Any]:
    """``fn(role, *args)`` in every role of a new world; the return values by rank."""
    proto = protocol_named(protocol)
    store = liveness.connect_store("127.0.0.1", 0, host=True)
    ctx, size = _context(start_method), proto.world_size(parties)
    procs, conns = [], []
    for rank in range(size):
        parent, child = ctx.Pipe(duplex=False)
        spec = RoleSpec(rank, parties, active_index % parties, proto, "127.0.0.1", store.port)
        procs.append(ctx.Process(target=_role, args=(spec, fn, tuple(args), child), daemon=True))
        conns.append(parent)
    try:
        for p in procs:
            p.start()
        return _collect(procs, conns, time.monotonic() + timeout_s, timeout_s)
    finally:
        _reap(procs)


def _context(start_method: str):
    """Never a plain fork of the caller: its threads (stores, sessions, thread pools) may hold locks the
    child would wait on forever. The fork server is a fresh process that imports torch once."""
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "falsevfl_secure.runtime.role"])
    return ctx


def _collect(procs: list, conns: list, deadline: float, timeout_s: float) -> list[Any]:
    results: dict[int, dict] = {}
    while len(results) < len(procs) and time.monotonic() < deadline:
        for rank, conn in enumerate(conns):
            if rank not in results and conn.poll(0.05):
                results[rank] = codec.unpack(conn.recv_bytes())
                if "error" in results[rank]:
                    deadline = min(deadline, time.monotonic() + _FAILURE_GRACE_S)
            elif rank not in results and procs[rank].exitcode is not None and not conn.poll(0.2):
                raise WorkerError(f"rank {rank} died without a result (exit code {procs[rank].exitcode})")
    failed = sorted((r["at"], rank) for rank, r in results.items() if "error" in r)
    if failed:
        first = failed[0][1]
        others = "; ".join(f"rank {r}: {results[r]['error'].splitlines()[0]}" for _, r in failed[1:])
        then = f"\nthen {others}" if others else ""
        raise WorkerError(f"rank {first} failed first: {results[first]['error']}{then}")
    if len(results) < len(procs):
        missing = sorted(set(range(len(procs))) - set(results))
        raise WorkerError(f"rank(s) {missing} missed the {timeout_s} s deadline")
    return [results[r]["ok"] for r in range(len(procs))]


def _reap(procs: list, grace_s: float = 5.0) -> None:
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)


__all__ = ["Role", "WorkerError", "run_world"]
