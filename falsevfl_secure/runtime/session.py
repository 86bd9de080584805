"""A long-lived process world for many single steps: one process per role that stays up and runs
jobs sent by the parent (used by the protocol-equivalence tests and the overhead benchmark, so
that process start-up, CrypTen set-up and CKKS key generation are paid once, not per example).

A job names a config, a synthetic split and a batch; every worker rebuilds the (seeded) models,
runs one stage-1 step, stage-2 step or prediction, and reports back what its own role computed:
the loss and predictions at the active party, its own parameters' gradients, and the round trace.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from ..audit import portable_entry
from ..errors import PartyFailure

JOB_TIMEOUT_S = 120


def build_job_world(job: dict, rank: int, transport):
    """The world and hosted data of role `rank` for a job (also used for the local reference)."""
    import torch

    from ..data.synthetic import synthetic_split
    from ..train import host_split
    from ..world import make_world
    from .distributed import config_from_dict, own_split

    cfg = config_from_dict(job["config"])
    split = synthetic_split(**job["split"])
    if job.get("permute_labels"):  # for the label-privacy audit: same features, permuted labels
        split.y = np.random.default_rng(12345).permutation(split.y)
    n_classes = job["split"].get("n_classes", 3)
    device = torch.device("cpu")
    if rank is None:  # the local reference hosts everything
        widths = {k: b.shape[1] for k, b in enumerate(split.blocks)}
        world = make_world(cfg, widths, n_classes, transport, device)
        return world, host_split(split, range(cfg.parties), True, device, n_classes)
    is_active = rank == cfg.active
    view = own_split(split, rank, is_active)
    world = make_world(cfg, {rank: split.blocks[rank].shape[1]}, n_classes if is_active else None,
                       transport, device)
    return world, host_split(view, [rank], is_active, device, n_classes)


def run_job_step(world, data, job: dict) -> dict:
    """One step of the job's stage; returns plain numpy/python values."""
    from ..steps import predict, stage1_loss, stage2_loss

    batch = data.batch(np.asarray(job["rows"]))
    out: dict = {}
    start = time.perf_counter()
    if job["stage"] == "pretrain":
        loss = stage1_loss(world, batch)
        world.transport.backward(loss)
    elif job["stage"] == "train":
        loss = stage2_loss(world, batch)
        if loss is not None:
            loss.backward()
    else:
        loss = None
        probs = predict(world, batch)
        if probs is not None:
            out["predictions"] = probs.numpy()
    out["seconds"] = time.perf_counter() - start  # the step and its rounds only
    out["communication"] = world.transport.log.table()
    if loss is not None:
        out["loss"] = float(loss.item())
    grads = {}
    for k, party in world.parties.items():
        for name, p in party.named_parameters():
            if p.grad is not None:
                grads[f"party{k}.{name}"] = p.grad.numpy().copy()
    if world.active is not None:
        for name, p in world.active.named_parameters():
            if p.grad is not None:
                grads[f"active.{name}"] = p.grad.numpy().copy()
    out["grads"] = grads
    out["trace"] = list(world.transport.log.trace)
    return out


def _worker(rank: int, world_size: int, port: int, protocol: str, parties: int, active: int,
            jobs: mp.Queue, results: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    import torch
    import torch.distributed as dist

    from ..config import Config
    from ..transport.accounting import CommLog
    from ..transport.distributed import DistributedTransport
    from .distributed import init_process_group, make_backend, shutdown_process_group

    torch.set_num_threads(1)
    try:
        init_process_group(rank, world_size, protocol)
        group = dist.new_group(list(range(parties))) if protocol == "he" else None
        cfg = Config(parties=parties, active_party=active)
        if protocol == "he" and rank == parties:
            from ..transport.he import run_aggregator

            run_aggregator(parties, active)
            shutdown_process_group(protocol, clean=True)
            results.put((rank, "done", None))
            return
        backend = make_backend(protocol, rank, cfg, group, None)
        results.put((rank, "ready", None))
        while True:
            job = jobs.get()
            if job is None:
                break
            try:
                backend.view = [] if job.get("record_views") else None
                transport = DistributedTransport(rank, parties, active, backend, CommLog())
                world, data = build_job_world(job, rank, transport)
                # Every party starts the step together, so a step's time is the step and its rounds,
                # not the wait for the slowest party to build its models.
                dist.barrier(group=group)
                out = run_job_step(world, data, job)
                if backend.view is not None:
                    out["view"] = [portable_entry(entry) for entry in backend.view]
                results.put((rank, "ok", out))
            except Exception:  # report, keep serving: the parent decides whether to stop
                results.put((rank, "error", traceback.format_exc()))
        if hasattr(backend, "close"):
            backend.close()
        shutdown_process_group(protocol, clean=True)
    except Exception:
        results.put((rank, "error", traceback.format_exc()))


@dataclass
class WorldSession:
    """`with WorldSession("mpc", parties=3) as world: world.run(job)`: a world kept alive."""

    protocol: str
    parties: int
    active: int = -1
    _procs: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.active %= self.parties
        self.world_size = self.parties + (1 if self.protocol == "he" else 0)

    def __enter__(self) -> WorldSession:
        from .distributed import free_port

        ctx = mp.get_context("spawn")
        self._jobs = [ctx.Queue() for _ in range(self.parties)]
        self._results = ctx.Queue()
        port = free_port()
        for rank in range(self.world_size):
            jobs = self._jobs[rank] if rank < self.parties else ctx.Queue()
            p = ctx.Process(target=_worker, args=(rank, self.world_size, port, self.protocol, self.parties,
                                                  self.active, jobs, self._results), daemon=True)
            p.start()
            self._procs.append(p)
        ready = 0
        while ready < self.parties:
            rank, status, payload = self._get()
            if status != "ready":
                self.close()
                raise PartyFailure(f"rank {rank} failed to start:\n{payload}")
            ready += 1
        return self

    def _get(self):
        try:
            return self._results.get(timeout=JOB_TIMEOUT_S)
        except queue.Empty:
            dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
            raise PartyFailure(f"no answer within {JOB_TIMEOUT_S} s (dead ranks: {dead})") from None

    def run(self, job: dict) -> dict[int, dict]:
        """Run one job on every party; returns each party's report."""
        for q in self._jobs:
            q.put(job)
        reports: dict[int, dict] = {}
        while len(reports) < self.parties:
            rank, status, payload = self._get()
            if status != "ok":
                self.close()
                raise PartyFailure(f"rank {rank} failed:\n{payload}")
            reports[rank] = payload
        return reports

    def close(self) -> None:
        for q in getattr(self, "_jobs", []):
            try:
                q.put(None)
            except (ValueError, OSError):
                pass
        deadline = time.monotonic() + 10
        for p in self._procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        self._procs.clear()

    def __exit__(self, *exc) -> None:
        self.close()
