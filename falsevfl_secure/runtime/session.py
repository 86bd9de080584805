"""Long-lived role processes for many single steps (the protocol-equivalence tests, the attack tests and
the overhead benchmark), so that process start-up and protocol set-up are paid once, not per step.

A `StepJob` names a configuration, a synthetic split, a batch and a stage; every party process rebuilds
its models (each party's secret is derived from the job's `secret_seed`, so the local reference can
build the very same models), runs one step and reports what its own role computed: the loss and
predictions at the active party, its own parameters' gradients, the round trace and, when asked, its
view. Processes start through the same `runtime.role.joined` path as every other role; reports come
back as fixed-schema bytes (`runtime.codec`), never pickles.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
import traceback
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..config import Config, Stage
from ..data.synthetic import synthetic_split
from ..errors import PartyFailure
from ..node import Node, build_node
from ..randomness import RoleSecret, public_rng
from ..steps import predict, stage1_loss, stage2_loss
from ..train import HostedData, host_split
from ..transport.protocols import Protocol, protocol_named
from ..transport.views import View
from . import codec, liveness
from .role import RoleSpec, joined

JOB_TIMEOUT_S = 120
CPU = torch.device("cpu")


@dataclass(frozen=True)
class StepJob:
    config: Config
    split: dict  # the arguments of `data.synthetic.synthetic_split`
    rows: tuple[int, ...]
    stage: Stage
    secret_seed: int | None = 0  # each party's secret: RoleSecret.for_tests(secret_seed, party); None: fresh
    record: bool = False  # every party reports its view of the step
    permute_labels: bool = False  # the label-privacy test: same features, permuted labels

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "config": self.config.to_dict(), "stage": int(self.stage)})

    @classmethod
    def from_json(cls, text: str | bytes) -> StepJob:
        d = json.loads(text)
        return cls(**{**d, "config": Config.from_dict(d["config"]), "rows": tuple(d["rows"]),
                      "stage": Stage(d["stage"])})


def build_step(job: StepJob, parties: list[int], with_labels: bool, transport) -> tuple[Node, HostedData]:
    """The node and data of a process hosting `parties` for a job (all parties: the local reference)."""
    split = synthetic_split(**job.split)
    if job.permute_labels:
        split.y = public_rng(job.config.seed, 12345).permutation(split.y)
    n_classes = job.split.get("n_classes", 3) if with_labels else None
    secrets = {k: RoleSecret.for_tests(job.secret_seed, k) for k in parties} if job.secret_seed is not None else None
    node = build_node(job.config, {k: split.blocks[k].shape[1] for k in parties}, n_classes, transport, CPU, secrets)
    return node, host_split(split.view(parties, with_labels), CPU, n_classes)


def run_step(node: Node, data: HostedData, job: StepJob) -> dict:
    """One step of the job's stage; plain numbers and arrays only."""
    batch, start, out = data.batch(np.asarray(job.rows)), time.perf_counter(), {}
    if job.stage is Stage.PRETRAIN:
        loss = stage1_loss(node, batch)
        node.transport.backward(loss)
    elif job.stage is Stage.TRAIN:
        loss = stage2_loss(node, batch)
        loss.map(torch.Tensor.backward)
    else:
        loss = predict(node, batch)
        out.update({"predictions": loss.get().numpy()} if loss.present else {})
    out["seconds"] = time.perf_counter() - start  # the step and its rounds only
    if loss.present and job.stage is not Stage.PREDICT:
        out["loss"] = float(loss.get().item())
    out["grads"] = {f"{owner}.{name}": p.grad.numpy().copy() for owner, module in _owned(node)
                    for name, p in module.named_parameters() if p.grad is not None}
    out.update(communication=node.transport.log.table(), trace=list(node.transport.log.trace))
    return out


def _owned(node: Node):
    yield from ((f"party{k}", role.model) for k, role in node.parties.items())
    if node.active.present:
        yield "active", node.active.get().model


def _serve(spec: RoleSpec, conn) -> None:
    """A session role: join, say ready, then run jobs until told to stop (helpers serve their protocol)."""
    torch.set_num_threads(1)
    try:
        with joined(spec) as role:
            conn.send_bytes(codec.pack({"ready": True}))
            if not role.is_party:
                role.spec.protocol.serve(role.membership)
                return
            while (data := conn.recv_bytes()) != b"stop":
                conn.send_bytes(codec.pack(_job(StepJob.from_json(data), role)))
    except Exception:  # report it; the parent decides
        conn.send_bytes(codec.pack({"error": traceback.format_exc()}))


def _job(job: StepJob, role) -> dict:
    try:
        role.backend.view = View() if job.record else None
        node, data = build_step(job, [role.spec.rank], role.is_active, role.transport(CPU))
        torch.distributed.barrier(group=role.membership.group)  # every party starts the step together
        out = run_step(node, data, job)
        if job.record:
            out["view"] = [{**asdict(e)} for e in role.backend.view]
        return {"ok": out}
    except Exception:
        return {"error": traceback.format_exc()}


@dataclass
class StepSession:
    """`with StepSession("mpc", parties=3) as session: session.run(job)`: role processes kept alive."""

    protocol: str | Protocol
    parties: int
    active_index: int = -1

    def __enter__(self) -> StepSession:
        self.proto, self.active_index = protocol_named(self.protocol), self.active_index % self.parties
        self.store = liveness.connect_store("127.0.0.1", 0, host=True)
        ctx, size = mp.get_context("spawn"), self.proto.world_size(self.parties)
        self._conns, self._procs = [], []
        for rank in range(size):
            parent, child = ctx.Pipe()
            spec = RoleSpec(rank, self.parties, self.active_index, self.proto, "127.0.0.1", self.store.port)
            self._procs.append(ctx.Process(target=_serve, args=(spec, child), daemon=True))
            self._procs[-1].start()
            self._conns.append(parent)
        for rank in range(size):
            self._answer(rank, "ready")
        return self

    def _answer(self, rank: int, key: str):
        if not self._conns[rank].poll(JOB_TIMEOUT_S):
            self.close()
            raise PartyFailure(f"rank {rank} gave no answer within {JOB_TIMEOUT_S} s")
        report = codec.unpack(self._conns[rank].recv_bytes())
        if key not in report:
            self.close()
            raise PartyFailure(f"rank {rank} failed:\n{report.get('error')}")
        return report[key]

    def run(self, job: StepJob) -> dict[int, dict]:
        """Run one job on every party; each party's report."""
        text = job.to_json().encode()
        for rank in range(self.parties):
            self._conns[rank].send_bytes(text)
        return {rank: self._answer(rank, "ok") for rank in range(self.parties)}

    def close(self) -> None:
        for conn in self._conns[: self.parties]:
            try:
                conn.send_bytes(b"stop")
            except (OSError, ValueError):
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


def local_reference(job: StepJob, record: View | None = None) -> dict:
    """The same step in one process (the plaintext reference); `record` receives every contribution."""
    from ..transport.local import LocalTransport

    cfg = job.config
    node, data = build_step(job, list(range(cfg.parties)), True, LocalTransport(cfg.parties, cfg.active_index,
                                                                                  record=record))
    return run_step(node, data, job)
