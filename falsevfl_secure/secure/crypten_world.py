"""Setting up (and tearing down) a CrypTen world in a worker process, and running one on this machine.

How CrypTen 0.4.1 initialises its communicator (read from its source, it is not documented):

* ``crypten.init()`` builds a ``DistributedCommunicator`` that reads the environment variables
  ``DISTRIBUTED_BACKEND``, ``RENDEZVOUS`` (an init-method URL such as ``tcp://host:port``), ``WORLD_SIZE``
  and ``RANK`` -- not ``MASTER_ADDR``/``MASTER_PORT`` -- and calls ``torch.distributed.init_process_group``
  itself, with torch's default 30-minute gloo timeout. Unset variables are filled with defaults that
  only work for a single process (a random ``file://`` rendezvous per process).
* If ``torch.distributed`` is already initialised, ``DistributedCommunicator.__init__`` silently does
  nothing and the communicator is left without its rank, world size and groups: CrypTen cannot reuse
  an existing process group through ``crypten.init()``.
* After the communicator, ``crypten.init()`` seeds the pseudo-random generators (``_setup_prng``): each
  party exchanges one seed with each ring neighbour ("prev"/"next"), which is what the zero sharing uses.

`init_crypten_worker` does the same steps itself so that it can pass a bounded ``timeout`` to
``init_process_group`` and to the groups CrypTen communicates on: a dead or stalled party then ends its
peers' collectives with an error after `timeout_s` instead of hanging for 30 minutes. It does not
touch ``os.environ``. ``crypten.uninit()`` (wrapped by `shutdown_crypten_worker`) tears it down as usual.

`run_crypten_world` forks K local workers (tests, benchmarks, the single-machine simulation), with a
deadline and reaping of every child it started.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from falsevfl_secure.crypten_shim import import_crypten

__all__ = ["WorkerError", "free_port", "init_crypten_worker", "run_crypten_world", "shutdown_crypten_worker"]


_FAILURE_GRACE_S = 2.0


class WorkerError(RuntimeError):
    """A worker of `run_crypten_world` raised, died, or missed the deadline; the message names the rank."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_crypten_worker(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    timeout_s: float = 120.0,
) -> ModuleType:
    """Join a CrypTen world of `world_size` processes over gloo (rendezvous at master_addr:master_port).

    Every party calls this with its own `rank`; rank 0's address is the rendezvous. Equivalent to
    setting ``RENDEZVOUS=tcp://addr:port DISTRIBUTED_BACKEND=gloo WORLD_SIZE RANK`` and calling
    ``crypten.init()``, except that all collectives time out after `timeout_s`. Returns the ``crypten``
    module. Requires CrypTen's default (trusted-first-party) provider: no TTP process.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    crypten = import_crypten()
    if crypten.is_initialized() or dist.is_initialized():
        raise RuntimeError("CrypTen / torch.distributed is already initialised in this process")
    if crypten.mpc.ttp_required():
        raise RuntimeError("the TTP provider needs an extra process; init_crypten_worker supports TFP only")
    timeout = timedelta(seconds=timeout_s)
    init_method = f"tcp://{master_addr}:{master_port}"
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
    )
    comm_cls = crypten.communicator.DistributedCommunicator
    # The attributes DistributedCommunicator.__init__ would set (crypten 0.4.1), with our timeout.
    communicator = comm_cls.__new__(comm_cls)
    communicator.distributed_backend = "gloo"
    communicator.rendezvous = init_method
    communicator.world_size = world_size
    communicator.rank = rank
    communicator.reset_communication_stats()
    communicator._name = f"rank{rank}"
    ranks = list(range(world_size))
    communicator.ttp_group = dist.new_group(ranks, timeout=timeout)
    communicator.main_group = dist.new_group(ranks, timeout=timeout)
    communicator.ttp_initialized = False
    comm_cls.instance = communicator
    # Neighbour seeds for the pseudo-random zero sharing (one exchange with each ring neighbour).
    crypten._setup_prng()
    return crypten


def shutdown_crypten_worker() -> None:
    """Leave the CrypTen world (destroys its process groups); a no-op when not initialised."""
    crypten = import_crypten()
    if crypten.is_initialized():
        crypten.uninit()


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: Sequence[Any],
    timeout_s: float,
    results: Any,
) -> None:
    torch.set_num_threads(1)
    try:
        init_crypten_worker(rank, world_size, "127.0.0.1", port, timeout_s=timeout_s)
    except BaseException as exc:
        _report_failure(results, rank, exc)
        return
    try:
        value = fn(rank, world_size, *args)
    except BaseException as exc:
        _report_failure(results, rank, exc)  # before the shutdown below makes the peers fail too
    else:
        results.put((rank, True, value, time.monotonic()))
    finally:
        try:
            shutdown_crypten_worker()
        except Exception:  # peers already gone: nothing left to tear down cleanly
            pass


def _report_failure(results: Any, rank: int, exc: BaseException) -> None:
    # CLOCK_MONOTONIC is system-wide on Linux: the parent orders failures by when they happened, so the
    # party that failed first is named first, not the peers that then lost their connection to it.
    failed_at = time.monotonic()
    results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", failed_at))


def run_crypten_world(
    world_size: int, fn: Callable[..., Any], args: Sequence[Any] = (), timeout_s: float = 60.0
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in `world_size` forked CrypTen workers; return results by rank.

    `fn` may be any callable (fork start method: nothing is pickled on the way in) and must return plain
    Python values (lists, floats, ...): tensors returned through a multiprocessing queue from a process that
    exits immediately afterwards are not reliably received (CrypTen's own ``run_multiprocess`` crashes).
    Raises `WorkerError` if a worker raises, dies, or the world misses `timeout_s`; every child started
    here is terminated/killed and joined before returning or raising.
    """
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker, args=(fn, r, world_size, port, tuple(args), timeout_s, results), daemon=True
        )
        for r in range(world_size)
    ]
    deadline = time.monotonic() + timeout_s
    received: dict[int, tuple[bool, Any]] = {}
    failed: list[tuple[float, int]] = []  # (when, rank): the earliest is usually the cause
    try:
        for p in procs:
            p.start()
        while len(received) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, ok, value, at = results.get(timeout=min(remaining, 0.5))
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if r not in received and p.exitcode is not None]
                if dead and results.empty():
                    codes = {r: procs[r].exitcode for r in dead}
                    raise WorkerError(
                        f"CrypTen worker(s) died without a result: exit codes {codes}"
                    ) from None
                continue
            received[rank] = (ok, value)
            if not ok:
                failed.append((at, rank))
                # Give the peers a moment to report too (they usually fail with "connection closed").
                deadline = min(deadline, time.monotonic() + _FAILURE_GRACE_S)
        if failed:
            first, *rest = [r for _, r in sorted(failed)]
            others = "; ".join(f"rank {r}: {received[r][1].splitlines()[0]}" for r in rest)
            raise WorkerError(
                f"CrypTen world of {world_size}: rank {first} failed first: {received[first][1]}"
                + (f"\nthen {others}" if others else "")
            )
        if len(received) < world_size:
            missing = sorted(set(range(world_size)) - set(received))
            raise WorkerError(
                f"CrypTen world of {world_size}: rank(s) {missing} missed the {timeout_s} s deadline"
            )
    finally:
        _reap(procs, grace_s=5.0 if len(received) == world_size and not failed else 0.0)
    return [received[r][1] for r in range(world_size)]


def _reap(procs: Sequence[multiprocessing.process.BaseProcess], grace_s: float = 5.0) -> None:
    """Join our children; terminate, then kill, any that do not exit within `grace_s`."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
