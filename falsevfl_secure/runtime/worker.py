"""Entry point of one role of the distributed runtime (see `runtime/distributed.py`).

    RANK=k WORLD_SIZE=K MASTER_ADDR=host MASTER_PORT=port python -m falsevfl_secure.runtime.worker --job job.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG),
    so no worker outlives its launcher. A no-op elsewhere; one role per host does not need it.

    `main` calls it before its heavy imports (torch takes seconds to import): a launcher that dies
    in that window would otherwise leave the worker behind. If it died even earlier, this worker has
    already been re-parented, and it leaves at once."""
    if sys.platform.startswith("linux") and os.environ.get("FALSEVFL_LAUNCHED") == "1":
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        launcher = os.environ.get("FALSEVFL_LAUNCHER_PID")
        if launcher is not None and os.getppid() != int(launcher):
            sys.exit(143)  # the launcher is gone already: the signal above will never come


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    # Imported here, after the parent-death signal is armed (and not at import time of this module).
    from ..errors import FalseVflError, PartyFailure
    from .distributed import config_from_dict, run_role

    parser = argparse.ArgumentParser(prog="python -m falsevfl_secure.runtime.worker")
    parser.add_argument("--job", required=True, help="JSON with the config, protocol and test patterns")
    args = parser.parse_args(argv)
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        print("error: RANK and WORLD_SIZE (and MASTER_ADDR, MASTER_PORT) must be set", file=sys.stderr)
        return 2
    job = json.loads(Path(args.job).read_text())
    cfg = config_from_dict(job["config"])
    try:
        result = run_role(cfg, job["protocol"], rank, world_size, tuple(job["test_patterns"]),
                          progress=os.environ.get("FALSEVFL_PROGRESS") == "1",
                          checkpoint_dir=job.get("checkpoint_dir"), resume=job.get("resume", False),
                          views_dir=job.get("views_dir"))
    except FalseVflError as error:
        print(f"error (rank {rank}): {error}", file=sys.stderr)
        return 2
    except PartyFailure as error:
        print(f"failure (rank {rank}): {error}", file=sys.stderr, flush=True)
        return 3
    if result is not None and os.environ.get("FALSEVFL_RESULT"):
        path = Path(os.environ["FALSEVFL_RESULT"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
