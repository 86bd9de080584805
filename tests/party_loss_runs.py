"""Runs in which one of four parties crashes mid-epoch (a real process exit), and their local references; shared
by tests/test_party_loss.py and bench/party_loss.py. A crash point is (epoch, step) of stage 1; the crashing
party exits as it starts that step, before it sends anything of it (a frame it had queued when it exited might or
might not leave, which would make the point the others notice depend on timing), so the active party notices
while it waits for that party's posterior term."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from falsevfl_secure.config import Config, Stage, StageConfig
from falsevfl_secure.network.agreement import Agreement
from falsevfl_secure.network.network import Blame, PartyLost
from falsevfl_secure.runtime.cast import local_specs
from falsevfl_secure.runtime.world import World
from falsevfl_secure.transport.in_process import LocalTransport
from falsevfl_secure.transport.protocols import protocol_named
from falsevfl_secure.transport.rounds import LIKELIHOOD, POSTERIOR

CPU = torch.device("cpu")
PATTERN = "mcar:0.2"
SECRET_SEED = 5
POLICY = {"on_party_loss": "continue", "min_parties": 3}


@dataclass(frozen=True)
class Crash:
    party: int
    epoch: int
    step: int
    steps_per_epoch: int
    round: int = 0  # of the step's three forward rounds: 0 the posterior term, 2 the likelihood term (the last)

    @property
    def step_index(self) -> int:
        """The crash's step counted from the start of stage 1."""
        return self.steps_per_epoch * self.epoch + self.step


def scheduled(cfg: Config, pretrain: int, train: int) -> Config:
    return replace(cfg, pretrain=replace(cfg.pretrain, epochs=pretrain), train=replace(cfg.train, epochs=train),
                   select_best=False)


def split_of(cfg: Config, parties: list[int], with_labels: bool):
    from falsevfl_secure.runtime.simulated import simulated_role
    from falsevfl_secure.train import host_split

    sim = simulated_role(cfg, (PATTERN,), parties, with_labels)
    return sim, host_split(sim.train, CPU, sim.n_classes), host_split(sim.tests[PATTERN], CPU, sim.n_classes)


def steps_per_epoch(cfg: Config) -> int:
    sim, _, _ = split_of(cfg, [0], False)
    return -(-sim.train.n // cfg.pretrain.batch_size)


def party_program(role, cfg_json: str, crash: list | None, checkpoints: str | None = None,
                  after_best: int | None = None) -> dict:
    """One role of the run: train both stages (each party's checkpoints in `checkpoints`, where a party that
    comes back resumes from its own), predict the test records (without a party that is out). With `after_best`,
    stage 2 keeps its best epoch on the test records (as validation records) and that party exits as soon as their
    forward rounds (`BestEpoch`, collective, as stage 2 starts) are done."""
    from falsevfl_secure.methods import build_node
    from falsevfl_secure.randomness import RoleSecret
    from falsevfl_secure.train import evaluate, fit

    if not role.is_party:  # the he aggregator
        role.serve_helper()
        return {}
    cfg = Config.from_dict(json.loads(cfg_json))
    sim, data, test = split_of(cfg, [role.rank], role.is_active)
    transport = role.transport(CPU)
    if crash is not None and Crash(*crash).party == role.rank:
        _crash_in(transport, Crash(*crash))
    if after_best is not None and after_best == role.rank:
        _exit_after_best_epoch()
    node = build_node(cfg, sim.widths, sim.n_classes, transport, CPU,
                      {role.rank: RoleSecret.for_tests(SECRET_SEED, role.rank)})
    folder = None if checkpoints is None else Path(checkpoints) / role.spec.name
    trained = fit(node, data, folder, progress=False, rejoin=role.rejoined_at,
                  validation=None if after_best is None else split_of(cfg, [role.rank], role.is_active)[2])
    test.drop_parties(role.peers.lost)  # its records are predicted from the others
    accuracy = evaluate(node, test)
    events = role.losses.events if role.losses is not None else []
    return {"accuracy": accuracy.get() if accuracy.present else None, "events": events, "losses": trained.losses,
            "reruns": role.losses.reruns if role.losses is not None else 0, "selection": trained.selection}


def _exit_after_best_epoch() -> None:
    """This process exits as the validation records' forward rounds of stage 2's choice end."""
    from falsevfl_secure import selection

    begin = selection.BestEpoch.__init__

    def then_exit(self, *args) -> None:
        begin(self, *args)
        os._exit(3)

    selection.BestEpoch.__init__ = then_exit


def _crash_in(transport, crash: Crash) -> None:
    """The process exits as it starts the crash step (three forward rounds a step: two sums, one broadcast; each
    starts with the transport's `aggregate` or `broadcast`)."""
    count = [0]

    def counted(forward):
        def run(round, *args):
            count[0] += 1
            if count[0] == 3 * crash.step_index + 1 + crash.round:
                os._exit(3)
            return forward(round, *args)
        return run

    transport.aggregate, transport.broadcast = counted(transport.aggregate), counted(transport.broadcast)


def distributed_run(folder: Path, protocol: str, cfg: Config, crash: Crash | None, rejoin: bool = False,
                    rejoin_settings: dict | None = None, after_best: int | None = None) -> list[dict]:
    """Every role's outcome of a run of four processes (with every party's consent to go on after a loss); with
    `rejoin`, the crashed party is started again as soon as it exited and comes back from its own checkpoint
    (its own file's settings changed by `rejoin_settings`, if given)."""
    names = [f"party{k}" for k in range(cfg.parties)]
    specs = local_specs(protocol_named(protocol), names, names[cfg.active_index], folder / "keys",
                        {"command": "test", **POLICY})
    checkpoints = str(folder / "checkpoints")
    args = (json.dumps(cfg.to_dict()), None if crash is None else list(vars(crash).values()), checkpoints, after_best)
    world = World(specs, party_program, args, folder / "world").start()
    if rejoin:
        crashed = world.procs[crash.party]
        crashed.join(600)
        assert crashed.exitcode == 3, crashed.exitcode  # it crashed where planned
        if rejoin_settings:
            spec = world.specs[crash.party]
            world.specs[crash.party] = replace(spec, agreement=Agreement({**spec.agreement.fields, **rejoin_settings}))
        world.rejoin(names[crash.party], (args[0], None, checkpoints))
    return world.outcomes(1800)


class LosingTransport(LocalTransport):
    """The local plain reference of a crash: the party's step is abandoned where the distributed run notices (the
    active party waits for its posterior term), and from then on it holds no row, by the training loop's own
    rules (`train._epoch_steps`)."""

    def __init__(self, cfg: Config, crash: Crash, splits: list, rejoin: tuple[int, int] | None = None) -> None:
        super().__init__(cfg.parties, cfg.active_index)
        self.crash, self.splits, self.sums = crash, splits, 0
        self.on_party_lost = _Abandon(crash.party, splits, rejoin)

    def aggregate(self, round, contributions):
        self.sums += round is POSTERIOR
        noticed = POSTERIOR if self.crash.round == 0 else LIKELIHOOD  # the round the party did not send
        if round is noticed and self.sums == self.crash.step_index + 1 and not self.on_party_lost.lost:
            raise PartyLost(blame=Blame(f"party{self.crash.party}", "left", noticed.name))
        return super().aggregate(round, contributions)


class _Abandon:
    """The reference's handler: the party holds no row from now on; the next step follows. With `rejoin`
    ((stage, epoch)), it comes back at that epoch's start with its state of its last checkpoint (`saved`, taken
    by the run's epoch hook) and holds its rows again, as a party that rejoins does."""

    def __init__(self, party: int, splits: list, rejoin: tuple[int, int] | None = None) -> None:
        self.party, self.splits, self.lost, self.rejoin = party, splits, set(), rejoin
        self.held = [split.held[party] for split in splits]
        self.node, self.saved, self.optimizers, self.reruns = None, None, None, 0

    def __call__(self, lost, position, begun: bool = True) -> int:
        self.lost = {self.party}
        _drop(self.splits, self.party)
        return position[2] + 1

    def pass_done(self, where: tuple[int, int], batches: int) -> None:
        pass  # one process: no party can be ahead of another

    def begin(self, batches: int) -> None:
        pass  # one process: nothing to key

    def charge(self, releases: int = 2) -> None:
        self.reruns += 1  # a pass's batch runs again without the party (each party's ledger would count it)

    def at_epoch(self, stage: int, epoch: int) -> list[str]:
        if (stage, epoch) != self.rejoin or not self.lost:
            return []
        from falsevfl_secure.checkpoint import restore_party

        restore_party(self.node, self.party, self.saved, self.optimizers)
        self.lost = set()
        for split, held in zip(self.splits, self.held, strict=True):
            split.held[self.party] = held
            split.set_dropped(set())
        return [f"party{self.party}"]


def _drop(splits: list, party: int) -> None:
    for split in splits:
        split.held[party] = torch.zeros_like(split.held[party])
        split.drop_parties({party})


def local_run(cfg: Config, crash: Crash, absent_from_epoch: bool = False, rejoin: tuple[int, int] | None = None
              ) -> tuple[float, dict]:
    """All parties in one process, plain sums, the same per-party secrets: the party's step abandoned where the
    distributed run notices the crash, or (`absent_from_epoch`) the party absent from the crash's epoch on;
    with `rejoin` ((stage, epoch)), back from there with its state of the end of the epoch before the crash."""
    from falsevfl_secure.methods import build_node
    from falsevfl_secure.randomness import RoleSecret
    from falsevfl_secure.train import evaluate, fit

    parties = list(range(cfg.parties))
    sim, data, test = split_of(cfg, parties, True)
    transport = LocalTransport(cfg.parties, cfg.active_index) if absent_from_epoch else \
        LosingTransport(cfg, crash, [data, test], rejoin)
    node = build_node(cfg, sim.widths, sim.n_classes, transport, CPU,
                      {k: RoleSecret.for_tests(SECRET_SEED, k) for k in parties})

    def absent(stage: Stage, epoch: int, optimizers: dict) -> None:
        if absent_from_epoch and stage is Stage.PRETRAIN and epoch == crash.epoch - 1:
            _drop([data, test], crash.party)
        if rejoin is not None and stage is Stage.PRETRAIN and epoch == crash.epoch - 1:  # its last checkpoint
            from falsevfl_secure.checkpoint import party_state

            handler = transport.on_party_lost
            handler.node, handler.optimizers = node, optimizers
            handler.saved = copy.deepcopy(party_state(node, crash.party, optimizers))

    trained = fit(node, data, progress=False, after_epoch=absent)
    return evaluate(node, test).get(), trained.losses


__all__ = ["Crash", "StageConfig", "distributed_run", "local_run", "scheduled", "steps_per_epoch"]
