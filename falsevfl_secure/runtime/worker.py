"""Entry point of one role of the distributed runtime (see `runtime/distributed.py`).

    RANK=k WORLD_SIZE=n MASTER_ADDR=host MASTER_PORT=port python -m falsevfl_secure.runtime.worker --job job.json

Every expected failure ends with one `error:` line on stderr and a non-zero exit code (2: this role's own
input or configuration, 3: a peer failed or stalled, 4: a crash, whose traceback goes to the log); the
role's own status (its message and round) is written to the rendezvous store first, so the launcher
reports the cause rather than the timeouts its peers saw afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG), so no
    worker outlives its launcher. Called before the heavy imports (torch takes seconds to import): if the
    launcher died even earlier, this worker has already been re-parented, and it leaves at once."""
    launcher = os.environ.get("FALSEVFL_LAUNCHER_PID")
    if sys.platform.startswith("linux") and launcher is not None:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != int(launcher):
            sys.exit(143)


def _environment() -> tuple[int, int, str, int]:
    try:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]))
    except (KeyError, ValueError):
        print("error: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be set to integers and an address",
              file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m falsevfl_secure.runtime.worker")
    parser.add_argument("--job", required=True, help="the job file the launcher wrote (JSON)")
    args = parser.parse_args(argv)
    rank, world_size, address, port = _environment()
    return run(args.job, rank, address, port)


def run(job_path: str, rank: int, address: str, port: int) -> int:
    """Run this role of the job to its end; the exit code says how it ended."""
    # Imported here, after the parent-death signal is armed (torch takes seconds to import).
    from ..errors import FalseVflError
    from . import liveness
    from .records import Job

    launched = "FALSEVFL_LAUNCHER_PID" in os.environ
    try:
        job = Job.read(job_path)
        store = liveness.connect_store(address, port, host=rank == 0 and not launched)
    except (FalseVflError, RuntimeError) as error:
        print(f"error (rank {rank}): {error}", file=sys.stderr)
        return 2
    return _run_role(job, rank, address, port, store, watch=not launched)


def _run_role(job, rank: int, address: str, port: int, store, watch: bool) -> int:
    from ..fsio import write_json
    from ..transport.protocols import protocol_named
    from .distributed import run_role
    from .role import RoleSpec

    spec = RoleSpec(rank, job.config.parties, job.config.active_index, protocol_named(job.protocol), address, port,
                    watch=watch, record=job.views_dir is not None)

    def program(role) -> None:
        result = run_role(job, role, _secret(), os.environ.get("FALSEVFL_PROGRESS") == "1")
        if result is not None and os.environ.get("FALSEVFL_RESULT"):
            write_json(os.environ["FALSEVFL_RESULT"], result.to_dict())

    return serve_role(spec, store, program, linger=rank == 0 and watch)


def serve_role(spec, store, program, linger: bool = False) -> int:
    """Join the world as `spec`, run `program(role)`, and report how the role ended: its status in the
    store (read by the launcher and, one host per party, by the peers), one `error:` line, an exit code.
    `linger`: this process serves the store, so it waits (up to a minute) for every role's status before
    it leaves, or the others would lose the store while they finish."""
    from ..errors import FalseVflError, PartyFailure
    from . import liveness
    from .role import joined

    def end(outcome: str, message: str, code: int) -> int:
        liveness.report_status(store, spec.rank, outcome, message, liveness.last_round(store, spec.rank))
        if message:
            print(f"error (rank {spec.rank}, {spec.name}): {message}", file=sys.stderr, flush=True)
        return code

    def on_stall(message: str) -> None:  # heartbeat thread: the main thread may be blocked in a collective
        liveness.exit_now(end("failure", message, 3))

    try:
        with joined(spec, store=store, on_stall=on_stall) as role:
            program(role)
        code = end("ok", "", 0)
    except FalseVflError as error:
        code = end("error", str(error), 2)
    except PartyFailure as error:
        code = end("failure", str(error), 3)
    except Exception as error:  # a crash: the launcher reports its message, the log keeps the traceback
        traceback.print_exc()
        code = end("error", f"{type(error).__name__}: {error}", 4)
    if linger:
        liveness.await_statuses(store, spec.world_size)
    return code


def _secret():
    """A secret handed to this role alone (tests that compare runtimes); None: draw a fresh one."""
    from ..randomness import RoleSecret

    text = os.environ.get("FALSEVFL_ROLE_SECRET")
    return RoleSecret(bytes.fromhex(text)) if text else None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc(limit=0)
        sys.exit(130)
