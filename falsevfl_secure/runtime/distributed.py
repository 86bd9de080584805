"""The distributed runtime: one operating-system process per role, connected by torch.distributed (gloo).

`run_distributed` launches a whole simulated world on this machine. The same worker also runs one role
per host: set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE and start
`python -m falsevfl_secure.runtime.worker --job JOB.json` on each host (rank k is party k; extra ranks are
the protocol's helpers, such as the `he` aggregator; rank 0 serves the rendezvous store).

Each process keeps only its own feature block (the split is simulated from the public seed, then every
other block is dropped before any model exists), and only the active party keeps the labels.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from ..checkpoint import KEEP, progress_key
from ..config import Config, Stage
from ..fsio import atomic_write
from ..node import Node, build_node, resolve_device
from ..randomness import RoleSecret
from ..train import HostedData, evaluate, fit, host_split, probe_step
from ..transport.accounting import CommLog
from ..transport.protocols import protocol_named
from ..transport.views import View, load_view, save_view
from .launcher import launch
from .records import Job, RunResult
from .role import Role
from .simulated import run_result, simulated_role


def run_role(job: Job, role: Role, secret: RoleSecret | None = None, progress: bool = False) -> RunResult | None:
    """The program of one role: a helper serves until the parties are done; a party trains and
    evaluates, and the active party returns the result."""
    if not role.is_party:
        if job.views_dir is not None:
            path = Path(job.views_dir) / f"rank{role.spec.rank}.npz"
            role.membership.on_recorded = lambda view: save_view(path, view)
        role.spec.protocol.serve(role.membership)
        return None
    return _party(job, role, secret, progress)


def _party(job: Job, role: Role, secret: RoleSecret | None, progress: bool) -> RunResult | None:
    cfg, rank, start = job.config, role.spec.rank, time.perf_counter()
    sim = simulated_role(cfg, job.test_patterns, [rank], role.is_active)
    device = resolve_device(cfg.device)
    node = build_node(cfg, sim.widths, sim.n_classes, role.transport(device), device,
                      {rank: secret} if secret is not None else None)
    data = host_split(sim.train, device, sim.n_classes)
    if job.views_dir is not None:
        _record_probe(node, data, role, Path(job.views_dir))
    trained = fit(node, data, job.checkpoint_dir, job.resume, progress and role.is_active, agree=agree_across(role))
    began = time.perf_counter()
    accuracy = {p: evaluate(node, host_split(v, device, sim.n_classes)) for p, v in sim.tests.items()}
    table = gather_log(node.transport.log, role)
    if not role.is_active:
        return None
    return run_result(cfg, sim, {p: a.get() for p, a in accuracy.items()}, trained, time.perf_counter() - start,
                      time.perf_counter() - began, job.protocol, "distributed", str(device), table, timed=True)


def _record_probe(node: Node, data: HostedData, role: Role, views_dir: Path) -> None:
    """--audit: what this role received and sent in one probe step, written to VIEWS/rank<r>.npz."""
    probe_step(node, data)
    save_view(views_dir / f"rank{role.spec.rank}.npz", role.view)
    role.backend.view = None


def agree_across(role: Role):
    """The epochs every party has a checkpoint of (a fixed-size all-gather of progress keys)."""
    def agree(common: set) -> set:
        keys = torch.full((KEEP,), -1, dtype=torch.int64)
        for i, progress in enumerate(sorted(common, key=progress_key)[-KEEP:]):
            keys[i] = progress_key(progress)
        gathered = [torch.empty_like(keys) for _ in range(role.spec.n_parties)]
        dist.all_gather(gathered, keys, group=role.membership.group)
        sets = [{(Stage(k // 1_000_000), k % 1_000_000) for k in g.tolist() if k >= 0} for g in gathered]
        return set.intersection(*sets)
    return agree


def gather_log(log: CommLog, role: Role) -> list[dict]:
    """Every party's counters reach the active party (counters only, a fixed-size tensor per party)."""
    mine = log.counters(role.spec.rank)
    gathered = [torch.empty_like(mine) for _ in range(role.spec.n_parties)] if role.is_active else None
    dist.gather(mine, gathered, dst=role.spec.active_index, group=role.membership.group)
    if not role.is_active:
        return []
    merged = CommLog(timed=True)
    for party, counters in enumerate(gathered):
        merged.merge(party, counters)
    return merged.table()


def run_distributed(cfg: Config, protocol: str, test_patterns: tuple[str, ...], progress: bool = True,
                    out_dir: Path | None = None, timeout_s: float | None = None, checkpoint_dir: Path | None = None,
                    resume: bool = False, audit: bool = False, secrets: Mapping[int, RoleSecret] | None = None,
                    allow_two_party_disclosure: bool = False) -> RunResult:
    """Launch one process per role on this machine and return the active party's result. With `audit`,
    every role records its view of one probe step and the result gets an "audit" record. `secrets`
    (tests only) fixes each party's secret, handed to that party's process alone."""
    proto = protocol_named(protocol)
    proto.check_parties(cfg.parties, allow_two_party_disclosure)
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="falsevfl-"))
    views = out_dir / "views" if audit else None
    job = Job(cfg, proto.name, tuple(test_patterns), None if checkpoint_dir is None else str(checkpoint_dir), resume,
              None if views is None else str(views))
    atomic_write(out_dir / "job.json", job.to_json())
    result_path = out_dir / "result.part.json"
    result_path.unlink(missing_ok=True)
    env = {r: {"FALSEVFL_ROLE_SECRET": s.key.hex()} for r, s in (secrets or {}).items()}
    env.setdefault(cfg.active_index, {}).update(FALSEVFL_RESULT=str(result_path), FALSEVFL_PROGRESS=str(int(progress)))
    size = proto.world_size(cfg.parties)
    argv = [["-m", "falsevfl_secure.runtime.worker", "--job", str(out_dir / "job.json")]] * size
    launch(argv, out_dir, [proto.role_name(r, cfg.parties) for r in range(size)], env,
           show_rank=cfg.active_index if progress else None, timeout_s=timeout_s)
    result = RunResult.from_dict(json.loads(result_path.read_text()))
    result_path.unlink()
    if audit:
        from ..audit import audit_recorded_views

        recorded = {r: load_view(views / f"rank{r}.npz") for r in range(size)}
        result.audit = audit_recorded_views(recorded, cfg.parties, cfg.active_index, proto.name)
    return result


__all__ = ["View", "agree_across", "gather_log", "run_distributed", "run_role"]
