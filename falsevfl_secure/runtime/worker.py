"""What every role process runs, however the run was started: join, run the role's program, leave, and
report how it ended.

`run_role(spec, program, ...)` is the whole life of a role in the current process (one host per party).
`serve_in_world(...)` is the same life as a child of `runtime.world.World`: it reports its hub's port, waits
for the address book, and sends its outcome to the parent through its pipe. Every outcome is one record:
`{"ok": value}`, or `{"error": message, "outcome": "error" | "failure" | "crash", "blame": ..., "at": ...}`
("error": this role's own input or configuration; "failure": another role ended the run, `blame` names
it; "crash": a bug, the message carries the traceback). Peers are told only who stopped and the error's
type, never its text.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict

from . import codec


class Parent:
    """The pipe to the process that started this role (sessions read jobs from it)."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def send(self, record: dict) -> None:
        self.conn.send_bytes(codec.pack(record))

    def recv(self) -> object:
        return codec.unpack(self.conn.recv_bytes())


def outcome_of(error: BaseException) -> dict:
    """The report of a role that ended with `error`."""
    from ..errors import FalseVflError, PartyFailure
    from ..network.network import RunAborted

    record = {"error": f"{error}", "outcome": "crash", "blame": None, "at": time.time()}
    if isinstance(error, RunAborted):
        record.update(outcome="failure", blame=asdict(error.blame))
    elif isinstance(error, FalseVflError):
        record["outcome"] = "error"
    elif isinstance(error, PartyFailure):
        record["outcome"] = "failure"
    elif isinstance(error, KeyboardInterrupt):
        record.update(outcome="failure", error="interrupted")
    else:
        record["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    return record


def run_role(spec, program: Callable, args: tuple = (), parent: Parent | None = None,
             addresses: dict[str, str] | None = None, on_port: Callable[[int | None], dict | None] | None = None,
             where: dict | None = None, role_class=None):
    """Join as `spec`, run `program(role, *args)`, leave; returns its value or raises what ended it (after
    telling the peers). `on_port` receives the hub's port and may return the address book; `where`, when
    given, receives the round the role was in when it failed; `role_class` (tests) replaces `Role`."""
    from ..heap import keep_freed_memory
    from ..network.network import RunAborted
    from ..node import flush_denormals
    from .role import Role

    flush_denormals()  # before any product: torch's worker threads, started later, inherit it
    keep_freed_memory()
    role = (role_class or Role)(spec, parent)
    clean = False
    try:
        port = role.serve()
        addresses = on_port(port) if on_port is not None else addresses
        role.join(addresses)
        value = program(role, *args)
        clean = True
        return value
    except BaseException as error:
        if where is not None:
            where["round"] = role.network.round
        if not isinstance(error, RunAborted):
            role.fail(error)
        raise
    finally:
        role.leave(clean)


def serve_in_world(spec, program: Callable, args: tuple, conn, role_class=None, errors=None) -> None:
    """The entry point of a `World` child: the role's life, its outcome reported to the parent (and its error line
    written to `errors`, standard error by default)."""
    _arm()
    parent = Parent(conn)

    def on_port(port: int | None) -> dict:
        parent.send({"port": port})
        return parent.recv()["addresses"]

    where: dict = {}
    try:
        value = run_role(spec, program, args, parent, on_port=on_port, where=where, role_class=role_class)
        parent.send({"ok": value})
    except BaseException as error:
        record = outcome_of(error)
        print(f"error ({spec.name}): {record['error']}", file=errors or sys.stderr, flush=True)  # into the role's log
        parent.send({**record, "round": where.get("round")})


def _arm() -> None:
    """A child never outlives its parent, and a terminal's Ctrl-C is acted on by the parent alone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent (the fork server) is already gone
        os._exit(143)
    import threading

    import torch
    from tqdm.auto import tqdm

    torch.set_num_threads(1)  # every role of a world shares this machine's cores
    tqdm.set_lock(threading.RLock())  # tqdm's default lock is a named semaphore that would outlive this process
