"""Long-lived role processes for many single steps (the protocol-equivalence tests, the attack tests and
the overhead benchmark), so that process start-up and protocol set-up are paid once, not per step.

A `StepJob` names a configuration, a synthetic split, a batch and a stage; every party process rebuilds
its models (each party's secret is derived from the job's `secret_seed`, so the local reference can
build the very same models), runs one step and reports what its own role computed: the loss and
predictions at the active party, its own parameters' gradients, the round trace and, when asked, its
view. Processes start as every other role does (`runtime.world.World`: identities, pinned TLS links,
the handshake); reports come back as fixed-schema bytes (`runtime.codec`), never pickles.
"""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import Config, Stage
from ..data.synthetic import synthetic_split
from ..errors import PartyFailure
from ..methods import build_node
from ..model.likelihood import CellLayout
from ..node import Node
from ..randomness import PublicStream, RoleSecret, public_rng
from ..train import HostedData, host_split
from ..transport.protocols import Protocol, protocol_named
from ..transport.views import View
from .cast import local_specs
from .world import World

JOB_TIMEOUT_S = 120
CPU = torch.device("cpu")


@dataclass(frozen=True)
class StepJob:
    config: Config
    split: dict  # the arguments of `data.synthetic.synthetic_split`
    rows: tuple[int, ...]
    stage: Stage
    secret_seed: int | None = None  # each party's secret: RoleSecret.for_tests(secret_seed, party) (tests); None: fresh
    record: bool = False  # every party reports its view of the step
    relabel: str = ""  # the label-privacy tests: same features, labels "permuted" or all one class ("constant")
    epoch_end: bool = False  # after the step, the stage's end-of-epoch rounds (FedHSSL's model average)
    kinds: tuple | None = None  # every party's cell kinds, (kind, start, stop) per column (model.likelihood)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "config": self.config.to_dict(), "stage": int(self.stage)})

    @classmethod
    def from_json(cls, text: str | bytes) -> StepJob:
        d = json.loads(text)
        kinds = None if d.get("kinds") is None else tuple(tuple(c) for c in d["kinds"])
        return cls(**{**d, "config": Config.from_dict(d["config"]), "rows": tuple(d["rows"]),
                      "stage": Stage(d["stage"]), "kinds": kinds})


def build_step(job: StepJob, parties: list[int], with_labels: bool, transport) -> tuple[Node, HostedData]:
    """The node and data of a process hosting `parties` for a job (all parties: the local reference)."""
    split = synthetic_split(**job.split)
    if job.relabel not in ("", "permuted", "constant"):
        raise ValueError(f"relabel = {job.relabel!r}: '', 'permuted' or 'constant'")
    if job.relabel == "permuted":  # the same class counts
        split.y = public_rng(job.config.seed, PublicStream.PERMUTED_LABELS).permutation(split.y)
    elif job.relabel == "constant":  # another class histogram (a count-dependent message would differ)
        split.y = np.zeros_like(split.y)
    n_classes = job.split.get("n_classes", 3) if with_labels else None
    secrets = {k: RoleSecret.for_tests(job.secret_seed, k) for k in parties} if job.secret_seed is not None else None
    layouts = None if job.kinds is None else {k: CellLayout.from_kinds(job.kinds) for k in parties}
    node = build_node(job.config, {k: split.blocks[k].shape[1] for k in parties}, n_classes, transport, CPU, secrets,
                      layouts)
    return node, host_split(split.view(parties, with_labels), CPU, n_classes)


def run_step(node: Node, data: HostedData, job: StepJob) -> dict:
    """One step of the job's stage (the method's loss, then `transport.backward`; or its predictions), then,
    with `epoch_end`, the stage's end-of-epoch rounds; plain numbers and arrays only."""
    method, start, cpu, out = node.method, time.perf_counter(), time.process_time(), {}
    batch = method.batch(data, np.asarray(job.rows), job.stage, 0, 0, job.config.seed)
    if job.stage is Stage.PREDICT:
        loss = method.predict(node, batch)
        out.update({"predictions": loss.get().cpu().numpy()} if loss.present else {})
    else:
        objective = method.loss(node, batch, job.stage)
        node.transport.backward(objective.active, list(objective.local.values()))
        node.privatize()
        loss = objective.reported(node.cfg.active_index)
        if job.epoch_end:
            method.end_epoch(node, job.stage)
            out["parameters"] = {f"party{k}.{name}": p.detach().cpu().numpy().copy() for k, role in node.parties.items()
                                 for name, p in role.model.named_parameters()}
    out["seconds"] = time.perf_counter() - start  # the step and its rounds only
    out["cpu_seconds"] = time.process_time() - cpu  # this role's process, its network threads included
    if loss.present and job.stage is not Stage.PREDICT:
        out["loss"] = float(loss.get().item())
    out["grads"] = {f"{owner}.{name}": p.grad.cpu().numpy().copy() for owner, module in _owned(node)
                    for name, p in module.named_parameters() if p.grad is not None}
    out.update(communication=node.transport.log.table(), trace=list(node.transport.log.trace),
               timeline=_timeline(node.transport.log.spans, start))
    return out


def _timeline(spans, start: float) -> list[tuple[str, float, float]]:
    """This step's rounds as (name, ms from the step's start at which this role entered it, ms it left)."""
    return [(name, round(1000 * (a - start), 3), round(1000 * (b - start), 3)) for name, a, b in spans if a >= start]


def _owned(node: Node):
    yield from ((f"party{k}", role.model) for k, role in node.parties.items())
    if node.active.present:
        yield "active", node.active.get().model


def serve_jobs(role) -> None:
    """A session role: say ready, then run jobs from the parent until told to stop (helpers serve their
    protocol until the parties close)."""
    if not role.is_party:
        role.serve_helper()
        return None
    role.parent.send({"ready": True})
    while (request := role.parent.recv()) != {"stop": True}:
        role.parent.send(_job(StepJob.from_json(request["job"]), role))
    return None


def _job(job: StepJob, role) -> dict:
    try:
        role.backend.view = View() if job.record else None
        node, data = build_step(job, [role.rank], role.is_active, role.transport(CPU))
        barrier(role)  # every party starts the step together
        out = run_step(node, data, job)
        if job.record:
            out["view"] = [{**asdict(e)} for e in role.backend.view]
        return {"ok": out}
    except Exception:
        return {"error": traceback.format_exc(), "outcome": "crash", "at": time.time()}


def barrier(role) -> None:
    """A declared `barrier` step: every party tells the active party it is ready, which then says go."""
    peers = role.peers
    others = [k for k in range(peers.n_parties) if k != peers.active_index]
    if not peers.is_active:
        peers.send(peers.active_index, "barrier", b"")
        peers.recv(peers.active_index, "barrier")
        return
    for party in others:
        peers.recv(party, "barrier")
    for party in others:
        peers.send(party, "barrier", b"")


@dataclass
class StepSession:
    """`with StepSession("mpc", parties=3) as session: session.run(job)`: role processes kept alive."""

    protocol: str | Protocol
    parties: int
    active_index: int = -1

    def __enter__(self) -> StepSession:
        self.proto, self.active_index = protocol_named(self.protocol), self.active_index % self.parties
        self._keys = tempfile.TemporaryDirectory(prefix="falsevfl-session-")
        names = [f"party{k}" for k in range(self.parties)]
        specs = local_specs(self.proto, names, names[self.active_index], Path(self._keys.name), {"command": "session"},
                            consent=True, record=True)
        self.world = World(specs, serve_jobs).start()
        for rank in range(self.parties):
            self._answer(rank, "ready")
        return self

    def _answer(self, rank: int, key: str):
        try:
            answer = self.world.answer(rank, key, JOB_TIMEOUT_S)
        except PartyFailure:
            self.close()
            raise
        return answer

    def run(self, job: StepJob) -> dict[int, dict]:
        """Run one job on every party; each party's report."""
        for rank in range(self.parties):
            self.world.ask(rank, {"job": job.to_json()})
        reports = {}
        for rank in range(self.parties):
            try:
                reports[rank] = self.world.answer(rank, "ok", JOB_TIMEOUT_S)
            except PartyFailure as error:
                self.close()
                raise PartyFailure(f"rank {rank} failed:\n{error}") from None
        return reports

    def close(self) -> None:
        if getattr(self, "world", None) is None:
            return
        for rank in range(self.parties):
            try:
                self.world.ask(rank, {"stop": True})
            except (OSError, ValueError):
                pass
        try:
            self.world.wait(30.0)
        except PartyFailure:
            pass
        self.world = None
        self._keys.cleanup()

    def __exit__(self, *exc) -> None:
        self.close()


def local_reference(job: StepJob, record: View | None = None, on_grid: bool = False) -> dict:
    """The same step in one process (the plaintext reference); `record` receives every contribution; `on_grid`:
    each addend of a sum as mpc and he encode it (the exact sum of those is what they reveal)."""
    from ..transport.in_process import LocalTransport

    cfg = job.config
    node, data = build_step(job, list(range(cfg.parties)), True, LocalTransport(cfg.parties, cfg.active_index,
                                                                                  record=record, on_grid=on_grid))
    return run_step(node, data, job)
