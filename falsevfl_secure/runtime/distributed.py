"""The distributed runtime: one operating-system process per role, over the authenticated gRPC links.

`run_distributed` runs a whole simulated federation on this machine as a `World`: a fresh identity per
role, the same star links, handshake and protocols as a federation of separately held tables. Each
process keeps only its own feature block (the split is simulated from the public seed, then every other
block is dropped before any model exists), and only the active party keeps the labels. Every party keeps
its own communication counters (never sent to another party); the launcher, which belongs to the
operator of every role, merges them into the result.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..checkpoint import KEEP, progress_key
from ..config import Config, Stage
from ..errors import InputError
from ..fsio import atomic_write
from ..methods import build_node, method_for
from ..network.handshake import pair_keys
from ..network.wire import Refused
from ..node import Node, resolve_device
from ..randomness import RoleSecret
from ..train import HostedData, evaluate, fit, host_split, probe_step, solo_work_units
from ..transport.accounting import merge_tables
from ..transport.protocols import protocol_named
from ..transport.views import load_view, save_view
from .cast import local_specs
from .losses import chained
from .records import Job, RunResult
from .role import Role
from .simulated import run_result, simulated_role
from .world import World


def simulated_program(role: Role, job: Job, progress: bool, secret: RoleSecret | None = None) -> dict:
    """The program of one role of a simulated run: a helper serves until the parties are done; a party
    trains and evaluates; every party returns its own counters, the active party also the result."""
    if not role.is_party:
        if job.views_dir is not None:
            path = Path(job.views_dir) / f"rank{role.rank}.npz"
            role.membership.on_recorded = lambda view: save_view(path, view)
            role.membership.recorded_rounds = method_for(job.config).probe_sums()
        role.network.allow_work(solo_work_units(job.config))  # its waits on parties that wait on the active one
        role.serve_helper()
        return {"communication": []}
    cfg, rank, start = job.config, role.rank, time.perf_counter()
    sim = simulated_role(cfg, job.test_patterns, [rank], role.is_active, {rank: secret} if secret is not None else None)
    device = resolve_device(cfg.device)
    node = build_node(cfg, sim.widths, sim.n_classes, role.transport(device), device,
                      {rank: secret} if secret is not None else None)
    data = host_split(sim.train, device, sim.n_classes)
    if job.views_dir is not None:
        _record_probe(node, data, role, Path(job.views_dir))
    trained = fit(node, data, job.checkpoint_dir, job.resume, progress and role.is_active, agree=agree_resume(role))
    began = time.perf_counter()
    accuracy = {p: evaluate(node, host_split(v, device, sim.n_classes)) for p, v in sim.tests.items()}
    table = node.transport.log.table()
    if not role.is_active:
        return {"communication": table}
    result = run_result(cfg, sim, {p: a.get() for p, a in accuracy.items()}, trained, time.perf_counter() - start,
                        time.perf_counter() - began, job.protocol, "distributed", str(device), table, timed=True)
    return {"communication": table, "result": result.to_dict()}


def _record_probe(node: Node, data: HostedData, role: Role, views_dir: Path) -> None:
    """--audit: what this role received and sent in one probe step, written to VIEWS/rank<r>.npz."""
    probe_step(node, data)
    save_view(views_dir / f"rank{role.rank}.npz", role.view)
    role.backend.view = None


def agree_resume(role: Role):
    """The declared `resume` step: every party sends the epochs it has checkpoints of (int64 progress
    keys) to the active party, which answers with the epochs every party has."""
    peers = role.peers

    def agree(common: set) -> set:
        mine = np.array(sorted(progress_key(p) for p in common)[-KEEP:], dtype="<i8")
        if not peers.is_active:
            peers.send(peers.active_index, "resume", mine.tobytes())
            answer = peers.recv(peers.active_index, "resume")
            agreed = {(Stage(k // 1_000_000), k % 1_000_000) for k in _keys(answer, peers.names[peers.active_index])}
        else:
            keys = set(mine.tolist())
            for party in (k for k in range(peers.n_parties) if k != peers.rank):
                keys &= set(_keys(peers.recv(party, "resume"), peers.names[party]).tolist())
            answer = np.array(sorted(keys), dtype="<i8").tobytes()
            for party in (k for k in range(peers.n_parties) if k != peers.rank):
                peers.send(party, "resume", answer)
            agreed = {(Stage(k // 1_000_000), k % 1_000_000) for k in keys}
        _key_masks_to(role, answer)
        for helper in range(peers.n_parties, len(peers.names)):  # he: the aggregator checks every party heard alike
            peers.send(helper, "resume-ack", hashlib.sha256(answer).digest())
        return agreed
    return agree


def _key_masks_to(role: Role, answer: bytes) -> None:
    """mpc: masks from pair keys of a purpose naming the resume answer: parties the active party told different
    epochs to resume from (hence different batches) hold different keys, and no sum of misaligned rows is revealed."""
    if hasattr(role.backend, "rekey"):
        before = role.losses.chain if role.losses is not None else ""  # (chained, should a resume ever come later)
        purpose = f"secure-sum/resume:{hashlib.sha256(answer).hexdigest()}/after:{before}"
        role.backend.rekey(pair_keys(role.session, role.spec.name, role.membership.exchange, purpose))
        if role.losses is not None:  # every later re-key names it (a loss's notice alike would not tell apart)
            role.losses.chain = chained(purpose)


def _keys(payload: bytes, sender: str) -> np.ndarray:
    """A `resume` frame's epoch keys; anything else is its sender's refusal, named to every role (red team: the
    receiver was named as failed)."""
    if len(payload) % 8 or len(payload) > 8 * KEEP:
        raise Refused(f"the resume step of {sender} carries {len(payload)} bytes, not at most {KEEP} int64 epoch "
                      "keys", sender)
    keys = np.frombuffer(payload, dtype="<i8").astype(np.int64)
    if ((keys // 1_000_000 < int(Stage.PRETRAIN)) | (keys // 1_000_000 > int(Stage.TRAIN))).any():
        raise Refused(f"the resume step of {sender} names a stage that does not train", sender)
    return keys


def run_distributed(cfg: Config, protocol: str, test_patterns: tuple[str, ...], progress: bool = True,
                    out_dir: Path | None = None, timeout_s: float | None = None, checkpoint_dir: Path | None = None,
                    resume: bool = False, audit: bool = False, secrets: Mapping[int, RoleSecret] | None = None,
                    allow_two_party_disclosure: bool = False) -> RunResult:
    """Launch one process per role on this machine and return the active party's result. With `audit`,
    every role records its view of one probe step and the result gets an "audit" record. `secrets`
    (tests only) fixes each party's secret, handed to that party's process alone."""
    proto = protocol_named(protocol)
    proto.check_parties(cfg.parties, allow_two_party_disclosure)
    if method_for(cfg).reads_own_reference:
        raise InputError("own_reference = true: the distributed simulation does not fit the active party's own "
                         "trees; use the local runtime (plain) or a federation")
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="falsevfl-"))
    views = out_dir / "views" if audit else None
    job = Job(cfg, proto.name, tuple(test_patterns), None if checkpoint_dir is None else str(checkpoint_dir), resume,
              None if views is None else str(views))
    atomic_write(out_dir / "job.json", job.to_json())
    names = [f"party{k}" for k in range(cfg.parties)]
    settings = {"command": "simulate", "method": method_for(cfg).label, "model": cfg.fingerprint()}
    specs = local_specs(proto, names, names[cfg.active_index], out_dir / "identities", settings,
                        consent=allow_two_party_disclosure, record=audit)
    per_role = {names[k]: ((secrets or {}).get(k),) for k in range(cfg.parties)}
    world = World(specs, simulated_program, (job, progress), out_dir,
                  show=names[cfg.active_index] if progress else None, per_role=per_role)
    values = world.start().wait(timeout_s)
    result = RunResult.from_dict(values[cfg.active_index]["result"])
    result.communication = merge_tables([v["communication"] for v in values])
    if audit:
        from ..audit import audit_recorded_views

        recorded = {r: load_view(views / f"rank{r}.npz") for r in range(len(specs))}
        result.audit = audit_recorded_views(recorded, cfg.parties, cfg.active_index, proto.name)
    return result


__all__ = ["agree_resume", "run_distributed", "simulated_program"]
