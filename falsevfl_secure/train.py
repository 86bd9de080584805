"""The two training stages and evaluation, readable top to bottom, the same loop for every method.

Each stage runs its epochs; an epoch is the method's public plan of mini-batches; a step is the method's
loss, then `transport.backward` (the adjoint rounds and every party's local loss), then one optimiser
step per role; after an epoch the method's end-of-epoch rounds, then every party's checkpoint. For
FALSE-VFL, stage 1 maximises the IWAE bound on every training sample over the generative parameters of
every party and of the active party, and stage 2 freezes all of them and maximises the conditional bound
over the discriminator, on labeled samples only; the baselines pretrain each party's extractor by SimSiam
on its own rows and then fine-tune with labels (`methods/`).
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .cached_stage import Stage2Cache, cached_epoch
from .config import AUTO_EPOCHS, Stage
from .errors import InputError
from .methods import method_for
from .model.trees import BAG
from .network.network import PartyLost
from .node import Batch, HostedData, Node, host_split
from .passes import each_batch
from .placement import Active, apply
from .privacy import step_releases
from .reference import FOLDS

EpochHook = Callable[[Stage, int, dict], None]
__all__ = ["EpochHook", "Fit", "HostedData", "evaluate", "fit", "host_split", "optimizers_for", "predict_split",
           "probe_step", "run_stage", "score"]  # HostedData and host_split (node.py): where callers find them


def optimizers_for(node: Node, stage: Stage) -> dict[str, torch.optim.Optimizer]:
    """One optimiser per role and stage (the method names the groups), so each party keeps (and
    checkpoints) only its own optimiser state: Adam, or SGD with momentum 0.9 (SimSiam's pretraining)."""
    settings = node.cfg.schedule(stage)

    def make(params) -> torch.optim.Optimizer:
        if settings.optimizer == "sgd":
            return torch.optim.SGD(params, lr=settings.lr, momentum=0.9, weight_decay=settings.weight_decay)
        return torch.optim.Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)

    return {name: make(list(params)) for name, params in node.method.parameters(node, stage).items()}


def _step(node: Node, batch: Batch, stage: Stage, optimizers: dict) -> Active[Tensor]:
    """One optimiser step of `stage`: the method's loss, then `transport.backward` (every process runs the
    adjoint rounds and its own local losses); the loss at the active party."""
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    node.forget_private()  # nothing of an earlier, abandoned step joins this one's rows
    objective = node.method.loss(node, batch, stage)
    node.transport.backward(objective.active, list(objective.local.values()))
    node.privatize()
    for opt in optimizers.values():
        opt.step()
    return objective.reported(node.cfg.active_index)


def stage_batches(node: Node, data: HostedData, stage: Stage, epoch: int) -> list[Batch]:
    """The batches of one epoch of `stage`, in the method's public plan (its first `steps_per_epoch`, if set)."""
    method, settings = node.method, node.cfg.schedule(stage)
    plan = method.plan(stage, data, epoch, node.cfg.seed, settings.batch_size)
    plan = plan[:settings.steps_per_epoch] if settings.steps_per_epoch else plan
    return [method.batch(data, rows, stage, epoch, i, node.cfg.seed) for i, rows in enumerate(plan)]


def run_stage(node: Node, data: HostedData, stage: Stage, optimizers: dict, start_epoch: int = 0,
              progress: bool = True, on_epoch_end: EpochHook | None = None) -> list[float]:
    """Train one stage from `start_epoch`; the mean loss per epoch (NaN where the active party is not hosted)."""
    settings = node.cfg.schedule(stage)
    if len(node.method.rows(stage, data)) == 0:
        raise InputError(f"stage {int(stage)} of {node.method.label} has nothing to train on: it trains on "
                         f"{node.method.row_rule[stage]}, and the training split has none")
    for module in node.modules():
        module.train()
    history = []
    desc = f"{node.method.label} stage {int(stage)}"
    bar = tqdm(range(start_epoch, settings.epochs), desc=desc, disable=not progress, initial=start_epoch,
               total=settings.epochs, unit="ep", mininterval=_bar_interval(), maxinterval=max(10.0, _bar_interval()))
    cached = stage is Stage.TRAIN and node.method.caches_stage2 and start_epoch < settings.epochs
    cache = Stage2Cache(node, data) if cached else None  # collective: stage 2's one pass of rounds
    for epoch in bar:
        if cache is None:
            losses = _epoch_steps(node, data, stage, epoch, optimizers)
            node.method.end_epoch(node, stage)
        else:
            losses = cached_epoch(node, data, cache, epoch, optimizers)
        history.append(_epoch_mean(losses, stage, epoch))
        bar.set_postfix(loss=f"{history[-1]:.3f}", refresh=False)  # at the interval's redraw (the count moves then)
        if on_epoch_end is not None:
            on_epoch_end(stage, epoch, optimizers)
    return history


def _bar_interval() -> float:
    """Seconds between a bar's redraws: a terminal's default, or 30 s where the output goes to a file (a trial's
    redirected log grew 30 KB of carriage-return redraws). tqdm's monitor thread redraws a bar left alone for its
    maxinterval (10 s by default: a later trial's file had a draw every 15 s), so that is the same."""
    return 0.1 if sys.stderr.isatty() else 30.0


def _epoch_steps(node: Node, data: HostedData, stage: Stage, epoch: int, optimizers: dict) -> list:
    """The steps of one epoch, (loss, rows) each. In a run that goes on without a lost party, the epoch opens
    with the active party's word on who is in it (a lost party may rejoin here, runtime/losses.py); when a
    party leaves, the step in flight is abandoned by every role (no optimiser step, no sum over fewer parties
    revealed for it) and every role resumes at the step the active party announces."""
    handler = getattr(node.transport, "on_party_lost", None) if node.method.survives_party_loss else None
    batches, losses, index = None, [], 0
    while batches is None or index < len(batches):
        try:
            if batches is None:
                if handler is not None:
                    handler.at_epoch(int(stage), epoch)
                    data.set_dropped(handler.lost)  # a party that rejoined holds its rows again
                batches = stage_batches(node, data, stage, epoch)
                if handler is not None:
                    handler.begin(len(batches))  # (after a loss later in the epoch: the same plan, not begun again)
                continue
            losses.append((_step(node, batches[index], stage, optimizers), batches[index].size))
            index += 1
        except PartyLost as lost:
            if handler is None:
                raise
            for opt in optimizers.values():
                opt.zero_grad(set_to_none=True)
            node.forget_private()
            node.transport.abandon()
            resumed = max(0, handler(lost, (int(stage), epoch, index if batches is not None else -1),  # -1: before
                                     begun=batches is not None))
            if batches is not None and resumed <= index:  # a step whose sums may be out runs again (never honestly:
                handler.charge(step_releases(node.cfg, stage))  # the step in flight is abandoned); charged first
            index = resumed  # (a loss announced between epochs: this epoch from its first step, not its last)
            data.set_dropped(handler.lost)  # from now on they hold no row
            batches = None if batches is None else stage_batches(node, data, stage, epoch)  # the same public plan
    return losses


def _epoch_mean(losses: list[tuple[Active[Tensor], int]], stage: Stage, epoch: int) -> float:
    """The row-weighted mean loss of an epoch; a non-finite loss ends the run with a clear error."""
    total, count = 0.0, 0
    for loss, rows in losses:
        if loss.present:
            value = loss.get().item()
            if not math.isfinite(value):
                raise InputError(f"stage {int(stage)}: the loss became {value} in epoch {epoch}; "
                                 "lower the learning rate or check the input data")
            total, count = total + value * rows, count + rows
    return total / count if count else math.nan


def pretrain(node: Node, data: HostedData, progress: bool = False) -> list[float]:
    """Stage 1 from scratch (a convenience for tests and notebooks)."""
    return run_stage(node, data, Stage.PRETRAIN, optimizers_for(node, Stage.PRETRAIN), progress=progress)


def train_discriminator(node: Node, data: HostedData, progress: bool = False) -> list[float]:
    """Stage 2 from scratch (a convenience for tests and notebooks)."""
    return run_stage(node, data, Stage.TRAIN, optimizers_for(node, Stage.TRAIN), progress=progress)


def probe_step(node: Node, data: HostedData) -> None:
    """One step (forward and backward rounds, on the first of the largest mini-batches of epoch 0) of each
    of the method's probe stages, and their end-of-epoch rounds, leaving every parameter and random stream
    as it was: the steps `--audit` records. Their traffic is counted."""
    states = [rand.state() for rand in node.randomness()]
    saved = [copy.deepcopy(module.state_dict()) for module in node.modules()]
    for stage in node.method.probe_stages:
        objective = node.method.loss(node, max(stage_batches(node, data, stage, 0), key=lambda b: b.size), stage)
        node.transport.backward(objective.active, list(objective.local.values()))
        node.method.end_epoch(node, stage)
    node.forget_private()
    for module, state in zip(node.modules(), saved, strict=True):
        module.load_state_dict(state)
        module.zero_grad(set_to_none=True)
    for rand, state in zip(node.randomness(), states, strict=True):
        rand.restore(state)


def predict_split(node: Node, data: HostedData) -> Active[Tensor]:
    """The method's predictions for every row of a split, in evaluation batches (at the active party). With
    record keys a row's prediction does not depend on the batch it is in or on earlier predictions (up to
    the float rounding of batched products); without, the roles' prediction streams restart here."""
    node.restart_noise(Stage.PREDICT)
    outputs = each_batch(node, data, np.arange(data.n), lambda batch: node.method.predict(node, batch),
                         (int(Stage.PREDICT), 0))  # a party lost meanwhile is left out, as in every pass
    return Active(torch.cat([o.get() for o in outputs])) if node.active.present else Active.absent()


def score(node: Node, predictions: Tensor, y: Tensor) -> float:
    """Accuracy in percent (classification) or RMSE (regression)."""
    if node.cfg.task == "classification":
        return 100.0 * (predictions.argmax(-1) == y).double().mean().item()
    return (predictions - y.to(predictions.dtype)).pow(2).mean().sqrt().item()


def evaluate(node: Node, data: HostedData) -> Active[float]:
    """`score` of the predictions of a split, at the active party."""
    return apply(lambda p, y: score(node, p, y), predict_split(node, data), data.y)


@dataclass
class Fit:
    """What training produced: the mean loss per epoch, the wall time of each stage, and where this
    process spent it (`split`: compute, the protocol's own work in its rounds, waiting on the network)."""

    losses: dict[str, list[float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    split: dict[str, dict[str, float]] = field(default_factory=dict)
    selection: dict | None = None  # stage 2's best epoch on the validation records (selection.py), or None
    trees: dict | None = None  # the active party's trees and their share of the blend (`head`), or None
    resumed: dict[str, int] = field(default_factory=dict)  # a resumed run: the epochs each stage had done before


def time_split(total: float, rounds: float, waiting: float) -> dict[str, float]:
    """A stage's wall time as compute (outside the rounds), protocol (in rounds, not waiting) and network."""
    return {"compute_s": round(total - rounds, 3), "protocol_s": round(rounds - waiting, 3),
            "network_s": round(waiting, 3)}


Agree = Callable[[set], set]  # combines the resumable epochs across processes (distributed runtime)


def solo_work_units(cfg, sized: bool = True) -> int:
    """The most units of its own work (`Transport.working`) the active party shows in a run: a cached stage 2's
    epochs, its trees' fits, its own trees' fits (the full one and each fold). `sized` False: for the largest
    schedule an unsized `cfg` may become (the he aggregator knows no record counts)."""
    epochs = AUTO_EPOCHS[Stage.TRAIN][1] if not sized and cfg.auto_schedule else cfg.train.epochs
    return epochs + BAG + (FOLDS + 1) * max(len(method_for(cfg).own_reference_kinds), 1)


def fit(node: Node, data: HostedData, checkpoint_dir: Path | str | None = None, resume: bool = False,
        progress: bool = True, agree: Agree | None = None, after_epoch: EpochHook | None = None,
        validation: HostedData | None = None, rejoin: tuple[int, int] | None = None) -> Fit:
    """Both stages, with each hosted party's checkpoint at the end of every epoch when `checkpoint_dir` is
    given; `resume` continues from the last epoch that every party completed; `rejoin` (a party that left a
    run that went on, readmitted at this (stage, epoch)) continues from its own latest checkpoint there. With
    `validation` records (and `select_best`), stage 2 keeps its best epoch on them (selection.py)."""
    from .checkpoint import Checkpointer
    from .selection import BestEpoch

    checkpointers = [Checkpointer(checkpoint_dir, k) for k in node.parties] if checkpoint_dir is not None else []
    node.transport.allow_work(solo_work_units(node.cfg))  # its waits on a party working alone, from its own file
    node.method.prepare(node, data)
    optimizers = {stage: optimizers_for(node, stage) for stage in (Stage.PRETRAIN, Stage.TRAIN)}
    start = _resume(node, checkpointers, optimizers, agree) if resume else {Stage.PRETRAIN: 0, Stage.TRAIN: 0}
    if rejoin is not None:
        start = _rejoin(node, checkpointers, optimizers, Stage(rejoin[0]), rejoin[1])
    for c in checkpointers if not (resume or rejoin) else []:
        c.clear()  # an earlier run's files would outrank this run's in the keep-the-latest rule

    best = None

    def on_epoch_end(stage: Stage, epoch: int, opts: dict) -> None:
        if best is not None and stage is Stage.TRAIN:
            best.update(epoch)
        _save_epoch(node, checkpointers, (stage, epoch), opts, best)
        if after_epoch is not None:
            after_epoch(stage, epoch, opts)

    result = Fit(resumed={st.key: start[st] for st in start if start[st]} if resume else {})
    for stage in (Stage.PRETRAIN, Stage.TRAIN):
        began, (rounds, waiting) = time.perf_counter(), node.transport.log.totals()
        if validation is not None:
            validation.set_dropped(data.dropped)  # a party out of the run holds no validation record either
        returned_in_stage_2 = rejoin is not None and Stage(rejoin[0]) is Stage.TRAIN  # after the rounds below
        if stage is Stage.TRAIN and _selects(node, validation) and not returned_in_stage_2:
            best = BestEpoch(node, validation)  # collective: the validation records' forward rounds, once
            best.load(_saved_selection(checkpointers, node, start) if resume else None)
        result.losses[stage.key] = run_stage(node, data, stage, optimizers[stage], start[stage], progress,
                                             on_epoch_end)
        if best is not None and stage is Stage.TRAIN:
            result.selection = best.restore()
        result.seconds[stage.key] = round(time.perf_counter() - began, 3)
        after = node.transport.log.totals()
        result.split[stage.key] = time_split(result.seconds[stage.key], after[0] - rounds, after[1] - waiting)
    return _finish(node, data, validation, best, result, progress)


def _save_epoch(node: Node, checkpointers: list, progress: tuple[Stage, int], opts: dict, best) -> None:
    """Each hosted party's checkpoint of the epoch just ended (the active party's with stage 2's choice so far)."""
    from .checkpoint import party_state

    for c in checkpointers:
        kept = party_state(node, c.party, opts)
        if best is not None and c.party == node.cfg.active_index and node.active.present:
            kept["selection"] = best.state()
        c.save(progress, kept, keep_stage1=node.method.caches_stage2)


def _saved_selection(checkpointers: list, node: Node, start: dict[Stage, int]) -> dict | None:
    """The stage-2 choice the active party's checkpoint kept at the epoch a resumed run starts after."""
    if start[Stage.TRAIN] == 0 or not node.active.present:
        return None
    active = [c for c in checkpointers if c.party == node.cfg.active_index]
    return active[0].load((Stage.TRAIN, start[Stage.TRAIN] - 1)).get("selection") if active else None


def _finish(node: Node, data: HostedData, validation: HostedData | None, best, result: Fit,
            progress: bool = False) -> Fit:
    """After the stages: the validation records as the run ends, and the active party's trees (`head`)."""
    from .model.trees import BAG
    from .selection import fit_trees

    if validation is not None:
        validation.set_dropped(data.dropped)
    if node.method.fits_trees and node.cfg.train.epochs > 0:
        if progress and node.active.present:  # (a trial saw 20 s of silence after the last bar)
            print("fitting the active party's trees: one forward pass over the labeled training records, then up to "
                  f"{BAG} models", file=sys.stderr, flush=True)
        result.trees = fit_trees(node, data, validation, best, _selects(node, validation))
    return result


def _selects(node: Node, validation: HostedData | None) -> bool:
    return bool(node.cfg.select_best and validation is not None and validation.n and node.method.selects_locally
                and node.cfg.train.epochs > 0)


def _rejoin(node: Node, checkpointers: list, optimizers: dict, stage: Stage, epoch: int) -> dict[Stage, int]:
    """A returning party: its own latest checkpoint (its part of the model did not change while it was out;
    none: it left in its first epoch and starts from its initial weights), from the (stage, epoch) it was
    readmitted at."""
    from .checkpoint import progress_key, restore_party

    if node.cfg.privacy.enabled:  # its noise streams would restart at the checkpoint: noise drawn twice
        raise InputError("--rejoin: a party cannot come back to a run under a privacy budget (its noise streams "
                         "would restart at its checkpoint and repeat noise it already released)")
    if stage is Stage.TRAIN and node.method.caches_stage2:  # stage 2's one pass is over: nothing to rejoin
        raise InputError("--rejoin: stage 2 runs its rounds once (stage2_pass = \"once\"): a party cannot come "
                         "back during it")
    for c in checkpointers:
        if c.available():
            saved = max(c.available(), key=progress_key)
            restore_party(node, c.party, c.load(saved), optimizers[saved[0]])
    if stage is Stage.PRETRAIN:
        return {Stage.PRETRAIN: epoch, Stage.TRAIN: 0}
    return {Stage.PRETRAIN: node.cfg.pretrain.epochs, Stage.TRAIN: epoch}


def _resume(node: Node, checkpointers: list, optimizers: dict, agree: Agree | None) -> dict[Stage, int]:
    """Restore every hosted party from the latest epoch all parties completed; the epochs to start from."""
    from .checkpoint import progress_key, restore_party

    if node.cfg.privacy.enabled:  # the interrupted epoch (and a cached stage 2's pass) would run its rounds again
        raise InputError("--resume: a run under a privacy budget cannot resume: the interrupted epoch's rows (with "
                         "stage2_pass = \"once\" every labeled row, and the validation records) would be released "
                         "again, which the budget does not count; train again from the start")
    common = set.intersection(*(set(c.available()) for c in checkpointers)) if checkpointers else set()
    if node.method.caches_stage2:  # its one pass runs again from stage 1's end, with the streams it had there
        common = {p for p in common if p[0] is Stage.PRETRAIN}
    common = agree(common) if agree is not None else common
    if not common:
        raise InputError("--resume: there is no checkpoint that every party completed; nothing to resume")
    stage, epoch = max(common, key=progress_key)
    for c in checkpointers:
        restore_party(node, c.party, c.load((stage, epoch)), optimizers[stage])
    if stage is Stage.PRETRAIN:
        return {Stage.PRETRAIN: epoch + 1, Stage.TRAIN: 0}
    return {Stage.PRETRAIN: node.cfg.pretrain.epochs, Stage.TRAIN: epoch + 1}
