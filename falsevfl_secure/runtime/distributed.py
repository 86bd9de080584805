"""The distributed runtime: one operating-system process per party (plus the aggregator for `he`),
connected by torch.distributed (gloo).

`run_distributed` launches the whole world on this machine. The same worker also runs one role
per host: set the standard MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE variables and start
`python -m falsevfl_secure.runtime.worker <simulate options>` on each host (rank k is party k; for
`he`, rank K is the aggregator).

Each process keeps only its own feature block (the split is simulated from the seed, then every
other block is dropped before any model exists) and only the active party keeps the labels.
A process that dies or stalls ends the run with an error naming it; no process is left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..audit import AGGREGATE_ROUNDS, save_view
from ..config import Config
from ..errors import FalseVflError, PartyFailure
from ..secure.crypten_world import free_port
from ..train import Stopwatch, evaluate, host_split, probe_step, run_training
from ..transport.accounting import CommLog
from ..transport.distributed import DistributedTransport
from ..world import make_world, resolve_device

STALL_TIMEOUT_S = 20  # a peer silent this long ends the run (issue: within 30 s)


def world_size_for(protocol: str, parties: int) -> int:
    return parties + 1 if protocol == "he" else parties


def own_split(split, party: int, is_active: bool):
    """What one party may hold of a simulated split: its block and held rows; labels only at the
    active party. The returned object has the `VerticalSplit` interface that `host_split` reads."""
    from types import SimpleNamespace

    block, held = split.party_block(party)
    missing = np.asarray(split.missing) if is_active else np.zeros((split.n, 0), dtype=bool)
    y = np.asarray(split.y) if is_active else np.zeros(0)
    return SimpleNamespace(n=split.n, missing=missing, y=y, labeled=np.asarray(split.labeled),
                           dropped=split.dropped, party_block=lambda k, b=block, h=held: (b, h))


def make_backend(protocol: str, party: int, cfg: Config, group, view):
    if protocol == "plain":
        from ..transport.plain import PlainBackend

        return PlainBackend(party, cfg.parties, cfg.active, group=group, view=view)
    if protocol == "mpc":
        from ..transport.mpc import MpcBackend

        return MpcBackend(party, cfg.parties, cfg.active, group=group, view=view)
    if protocol == "he":
        from ..transport.he import HeBackend

        return HeBackend(party, cfg.parties, cfg.active, group=group, view=view)
    raise FalseVflError(f"unknown protocol {protocol!r}; choose plain, mpc or he")


def init_process_group(rank: int, world_size: int, protocol: str = "plain") -> None:
    """gloo over the MASTER_ADDR/MASTER_PORT rendezvous; every collective times out after
    STALL_TIMEOUT_S so a stalled peer ends the run instead of hanging it. For `mpc` the CrypTen
    communicator is set up over the same world (all ranks are parties)."""
    if protocol == "mpc":
        from ..secure.crypten_world import init_crypten_worker

        init_crypten_worker(rank, world_size, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                            timeout_s=STALL_TIMEOUT_S)
        return
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=STALL_TIMEOUT_S))


def shutdown_process_group(protocol: str, clean: bool = False) -> None:
    """Leave the world. After a successful run every rank first waits at a barrier: tearing gloo
    down while a peer still closes its side can abort the process ("terminate called without an
    active exception")."""
    if clean and dist.is_initialized():
        try:
            dist.barrier()
        except RuntimeError:
            pass
    if protocol == "mpc":
        from ..secure.crypten_world import shutdown_crypten_worker

        shutdown_crypten_worker()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_role(cfg: Config, protocol: str, rank: int, world_size: int, test_patterns: tuple[str, ...],
             progress: bool = False, checkpoint_dir: str | None = None, resume: bool = False,
             views_dir: str | None = None) -> dict | None:
    """Run one role to the end: party `rank` (the active party returns the result record), or the
    `he` aggregator when rank == K. With `views_dir`, every role first runs one probe step
    (`train.probe_step`) and writes what it received in it to VIEWS_DIR/rank<r>.pkl for the audit."""
    from .local import make_splits

    torch.set_num_threads(1)
    clock = Stopwatch()
    init_process_group(rank, world_size, protocol)
    backend = None
    finished = False
    try:
        group = dist.new_group(list(range(cfg.parties))) if protocol == "he" else None
        if protocol == "he" and rank == cfg.parties:
            from ..transport.he import run_aggregator

            def save(view: list) -> None:
                save_view(Path(views_dir) / f"rank{rank}.pkl", view)

            recording = views_dir is not None
            run_aggregator(cfg.parties, cfg.active, view=[] if recording else None,
                           record_rounds=len(AGGREGATE_ROUNDS) if recording else None, on_recorded=save)
            finished = True
            return None
        device = resolve_device(cfg.device)
        is_active = rank == cfg.active
        dataset, train_split, tests = make_splits(cfg, test_patterns)
        width = train_split.party_block(rank)[0].shape[1]
        train_view = own_split(train_split, rank, is_active)
        test_views = {p: own_split(s, rank, is_active) for p, s in tests.items()}
        dropped = {"train": train_split.dropped, **{p: s.dropped for p, s in tests.items()}}
        n_test = {p: s.n for p, s in tests.items()}
        del dataset, train_split, tests  # nothing of the other parties stays in this process

        log = CommLog()
        backend = make_backend(protocol, rank, cfg, group, None)
        transport = DistributedTransport(rank, cfg.parties, cfg.active, backend, log, device)
        n_classes = None
        if is_active:  # the label side needs the number of classes (cached: no second file read)
            from ..data import load_dataset

            n_classes = load_dataset(cfg.dataset, seed=cfg.seed).n_classes
        world = make_world(cfg, {rank: width}, n_classes, transport, device)
        data = host_split(train_view, [rank], is_active, device, n_classes)
        if views_dir is not None:  # --audit: record what this role receives in one probe step
            backend.view = []
            probe_step(world, data)
            save_view(Path(views_dir) / f"rank{rank}.pkl", backend.view)
            backend.view = None
        def agree(common: set) -> set:  # the epochs every party has a checkpoint of
            sets = [None] * cfg.parties
            dist.all_gather_object(sets, common, group=group)
            return set.intersection(*sets)

        stage_seconds: dict = {}
        stage1, stage2 = run_training(world, data, checkpoint_dir, resume, progress and is_active, agree,
                                      seconds=stage_seconds)
        eval_start = clock()
        accuracy = {p: evaluate(world, host_split(v, [rank], is_active, device, n_classes))
                    for p, v in test_views.items()}
        # Every party's accounting reaches the active party's report (counters only, no data).
        tables = [None] * cfg.parties
        dist.all_gather_object(tables, log.table(), group=group)
        finished = True
        if not is_active:
            return None
        return {
            "accuracy": accuracy,
            "wall_time_s": round(clock(), 3),
            "stage_time_s": {**stage_seconds, "evaluate": round(clock() - eval_start, 3)},
            "protocol": protocol,
            "runtime": "distributed",
            "device": str(device),
            "losses": {"pretrain": stage1, "train": stage2},
            "samples": {"train": data.n, "labeled": len(data.labeled_index), "test": n_test},
            "dropped_no_observed_party": dropped,
            "communication": [row for table in tables for row in table],
        }
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
        shutdown_process_group(protocol, clean=finished)


def _round_in(text: str) -> str | None:
    match = re.search(r"round '([a-z_]+)'", text)
    return match.group(1) if match else None


def diagnose(procs: list[subprocess.Popen], out_dir: Path, settle_s: float = STALL_TIMEOUT_S + 3) -> str:
    """Name the party that failed and the round it happened in.

    A party that dies makes its peers fail at once on the closed connection; a party that stalls
    makes them fail when the collective timeout (STALL_TIMEOUT_S) expires. Either way the peers'
    logs name the round. A rank that is still running while the others fail on it is the staller.
    """
    def read_logs() -> list[str]:
        return [(out_dir / f"rank{r}.log").read_text(errors="replace") for r in range(len(procs))]

    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if any(_round_in(text) for text in read_logs()):
            break
        time.sleep(0.1)
    codes = [p.poll() for p in procs]
    logs = read_logs()
    rounds = [r for r in (_round_in(text) for text in logs) if r]
    where = f" in round '{rounds[0]}'" if rounds else " outside the rounds (start-up or shut-down)"
    killed = [r for r, c in enumerate(codes) if c is not None and c < 0]
    stalled = [r for r, c in enumerate(codes) if c is None]
    if killed:
        culprit = f"rank {killed[0]} died (signal {-codes[killed[0]]})"
    elif stalled:
        culprit = f"rank {stalled[0]} stalled (no answer within {STALL_TIMEOUT_S} s)"
    else:
        first = next(r for r, c in enumerate(codes) if c not in (None, 0))
        culprit = f"rank {first} exited with code {codes[first]}"
    details = "\n".join(f"--- rank {r}: {logs[r].strip().splitlines()[-1][:300]}" for r in range(len(procs))
                        if codes[r] not in (None, 0) and logs[r].strip())
    return f"{culprit}{where}\n{details}"


def _hold_sigint() -> bool:
    """Block SIGINT for this thread (main thread only, POSIX); True when it was blocked here."""
    import threading

    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        return False
    return signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _release_sigint(held: bool) -> None:
    """Unblock SIGINT again; one that came in the meantime is delivered now (KeyboardInterrupt)."""
    if held:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def launch(worker_args: list[str], world_size: int, out_dir: Path, timeout_s: float | None = None,
           show_rank: int | None = None) -> dict:
    """Start `world_size` workers on this machine, wait for them, and return the active party's
    result. Any worker failing (or Ctrl-C) terminates all of them; none is left behind.

    Each worker's output goes to OUT/rank<k>.log; `show_rank`'s progress bars (stderr) go to the
    terminal instead."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = Path(tempfile.mkdtemp(dir=out_dir, prefix="result-")) / "result.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "FALSEVFL_PROGRESS": "1" if show_rank is not None else "0", "FALSEVFL_LAUNCHED": "1",
           "WORLD_SIZE": str(world_size), "FALSEVFL_RESULT": str(result_path), "OMP_NUM_THREADS": "1",
           "FALSEVFL_LAUNCHER_PID": str(os.getpid())}
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        # Ctrl-C is held while the workers are being started: interrupted in the middle of a
        # Popen, the launcher would lose track of a worker that already runs. It arrives after.
        # The workers inherit the blocked mask and keep it: a Ctrl-C at the terminal reaches the
        # whole process group, and only the launcher acts on it (it stops every worker, below).
        held = _hold_sigint()
        try:
            for rank in range(world_size):
                log_file = open(out_dir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
                logs.append(log_file)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "falsevfl_secure.runtime.worker", *worker_args],
                    env={**env, "RANK": str(rank)}, stdout=log_file,
                    stderr=None if rank == show_rank else subprocess.STDOUT,
                ))
        finally:
            _release_sigint(held)
        start = time.monotonic()
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise PartyFailure(diagnose(procs, out_dir))
            if all(c == 0 for c in codes):
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise PartyFailure(f"the run did not finish within {timeout_s} s")
            time.sleep(0.1)
        return json.loads(result_path.read_text())
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


def run_distributed(cfg: Config, protocol: str, test_patterns: tuple[str, ...], progress: bool = True,
                    out_dir: Path | None = None, timeout_s: float | None = None,
                    checkpoint_dir: Path | None = None, resume: bool = False, audit: bool = False) -> dict:
    """Launch one process per role on this machine and return the active party's result. With
    `audit`, every role records its view of one probe step and the result gets an "audit" record:
    those views checked against the threat models and a plaintext shadow of the same step."""
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="falsevfl-"))
    job = out_dir / "job.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    views_dir = out_dir / "views" if audit else None
    job.write_text(json.dumps({"config": cfg.to_dict(), "protocol": protocol, "test_patterns": list(test_patterns),
                               "checkpoint_dir": None if checkpoint_dir is None else str(checkpoint_dir),
                               "resume": resume, "views_dir": None if views_dir is None else str(views_dir)}))
    result = launch(["--job", str(job)], world_size_for(protocol, cfg.parties), out_dir, timeout_s,
                    show_rank=cfg.active if progress else None)
    if audit:
        from ..audit import audit_recorded_views, load_views

        result["audit"] = audit_recorded_views(cfg, protocol, load_views(views_dir))
    return result


def config_from_dict(d: dict) -> Config:
    from ..config import StageConfig

    return replace(Config(), **{**d, "pretrain": StageConfig(**d["pretrain"]), "train": StageConfig(**d["train"])})
