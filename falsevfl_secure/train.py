"""The two training stages and evaluation, readable top to bottom.

Stage 1 maximises the IWAE bound on every training sample (labeled or not, aligned or not) over
the generative parameters of every party and of the active party. Stage 2 freezes all of them and
maximises the conditional bound over the discriminator, on labeled samples only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .errors import InputError
from .steps import predict, stage1_loss, stage2_loss
from .world import Batch, World


@dataclass
class HostedData:
    """The part of one split this process holds: its parties' blocks and held-row masks; at the
    active party also the number of observed parties per row and the labels.

    `labeled_index` (sample identifiers of the labeled rows, not the labels) is what the active
    party announces to the parties before stage 2 so they know which rows to encode.
    """

    n: int
    x: dict[int, Tensor]
    held: dict[int, Tensor]
    n_observed: Tensor | None
    y: Tensor | None
    labeled_index: np.ndarray

    def batch(self, rows: np.ndarray) -> Batch:
        index = torch.from_numpy(rows).to(next(iter(self.x.values())).device)
        return Batch(
            x={k: v.index_select(0, index) for k, v in self.x.items()},
            held={k: v.index_select(0, index) for k, v in self.held.items()},
            n_observed=None if self.n_observed is None else self.n_observed.index_select(0, index),
            y=None if self.y is None else self.y.index_select(0, index),
        )


def host_split(split, parties: Iterable[int], hosts_active: bool, device: torch.device,
               n_classes: int | None = None) -> HostedData:
    """Load what the given roles hold of `split` (a `data.VerticalSplit`), validating it."""
    x, held = {}, {}
    for k in parties:
        block, held_rows = split.party_block(k)
        if not np.isfinite(block).all():
            raise InputError(f"party {k}: its feature block contains NaN or inf values")
        x[k] = torch.as_tensor(np.ascontiguousarray(block), dtype=torch.float32, device=device)
        held[k] = torch.as_tensor(np.asarray(held_rows, dtype=bool), device=device)
    n_observed = y = None
    if hosts_active:
        observed = (~np.asarray(split.missing)).sum(axis=1)
        if split.n and observed.min() == 0:
            raise InputError(f"{int((observed == 0).sum())} samples have no observed party; "
                             "the split must apply the empty-row rule first")
        n_observed = torch.as_tensor(observed, dtype=torch.float32, device=device)
        labels = np.asarray(split.y)
        if n_classes is not None and labels.size and (labels.min() < 0 or labels.max() >= n_classes):
            raise InputError(f"labels must lie in 0..{n_classes - 1}; got {labels.min()}..{labels.max()}")
        y = torch.as_tensor(labels, device=device)
    return HostedData(split.n, x, held, n_observed, y, np.flatnonzero(np.asarray(split.labeled)))


def epoch_batches(rows: np.ndarray, batch_size: int, seed: int, stage: int, epoch: int) -> list[np.ndarray]:
    """The shuffled mini-batches of one epoch; every process derives the same order from the seed."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, stage, epoch]))
    order = rows[rng.permutation(len(rows))]
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _adam(params, stage) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=stage.lr, weight_decay=stage.weight_decay)


def stage1_optimizers(world: World) -> dict[str, torch.optim.Optimizer]:
    """One Adam per role, so each party keeps (and checkpoints) only its own optimiser state."""
    stage = world.cfg.pretrain
    optimizers = {f"party{k}": _adam(p.parameters(), stage) for k, p in world.parties.items()}
    if world.hosts_active:
        optimizers["active"] = _adam(world.active.generative_parameters(), stage)
    return optimizers


def stage2_optimizers(world: World) -> dict[str, torch.optim.Optimizer]:
    if not world.hosts_active:
        return {}
    return {"discriminator": _adam(world.active.discriminator.parameters(), world.cfg.train)}


def _check_loss(loss: Tensor | None, stage: str, epoch: int) -> None:
    if loss is not None and not torch.isfinite(loss):
        raise InputError(f"{stage}: the loss became {loss.item()} in epoch {epoch}; "
                         "lower the learning rate or check the input data")


def pretrain(world: World, data: HostedData, epochs: int | None = None, start_epoch: int = 0,
             optimizers: dict | None = None, progress: bool = True,
             on_epoch_end: Callable[[int, dict], None] | None = None) -> list[float]:
    """Stage 1. Returns the mean loss per epoch (NaN on processes without the active party)."""
    cfg = world.cfg
    epochs = cfg.pretrain.epochs if epochs is None else epochs
    optimizers = optimizers or stage1_optimizers(world)
    for module in world.parties.values():
        module.train()
    history = []
    bar = tqdm(range(start_epoch, epochs), desc="stage 1 (IWAE pretraining)", disable=not progress,
               initial=start_epoch, total=epochs, unit="ep")
    for epoch in bar:
        total, count = 0.0, 0
        for rows in epoch_batches(np.arange(data.n), cfg.pretrain.batch_size, cfg.seed, 1, epoch):
            for opt in optimizers.values():
                opt.zero_grad(set_to_none=True)
            loss = stage1_loss(world, data.batch(rows))
            _check_loss(loss, "stage 1", epoch)
            world.transport.backward(loss)
            for opt in optimizers.values():
                opt.step()
            if loss is not None:
                total, count = total + loss.item() * len(rows), count + len(rows)
        history.append(total / count if count else math.nan)
        bar.set_postfix(loss=f"{history[-1]:.2f}")
        if on_epoch_end is not None:
            on_epoch_end(epoch, optimizers)
    return history


def train_discriminator(world: World, data: HostedData, epochs: int | None = None, start_epoch: int = 0,
                        optimizers: dict | None = None, progress: bool = True,
                        on_epoch_end: Callable[[int, dict], None] | None = None) -> list[float]:
    """Stage 2: the generative parameters are frozen; only the discriminator learns."""
    cfg = world.cfg
    epochs = cfg.train.epochs if epochs is None else epochs
    optimizers = optimizers or stage2_optimizers(world)
    if len(data.labeled_index) == 0:
        raise InputError("stage 2 needs labeled samples; the training split has none")
    history = []
    bar = tqdm(range(start_epoch, epochs), desc="stage 2 (discriminator)", disable=not progress,
               initial=start_epoch, total=epochs, unit="ep")
    for epoch in bar:
        total, count = 0.0, 0
        for rows in epoch_batches(data.labeled_index, cfg.train.batch_size, cfg.seed, 2, epoch):
            for opt in optimizers.values():
                opt.zero_grad(set_to_none=True)
            loss = stage2_loss(world, data.batch(rows))
            _check_loss(loss, "stage 2", epoch)
            if loss is not None:
                loss.backward()
                total, count = total + loss.item() * len(rows), count + len(rows)
            for opt in optimizers.values():
                opt.step()
        history.append(total / count if count else math.nan)
        bar.set_postfix(loss=f"{history[-1]:.3f}")
        if on_epoch_end is not None:
            on_epoch_end(epoch, optimizers)
    return history


def probe_step(world: World, data: HostedData) -> None:
    """The rounds of one stage-1 step (forward and backward) on the first mini-batch of epoch 0,
    leaving the parameters and every generator as they were: the step whose messages `--audit`
    records and audits, without changing the training that follows. Its traffic is counted in the
    run's communication table."""
    states = {role: generator.get_state() for role, generator in world.generators.items()}
    rows = epoch_batches(np.arange(data.n), world.cfg.pretrain.batch_size, world.cfg.seed, 1, 0)[0]
    world.transport.backward(stage1_loss(world, data.batch(rows)))
    for module in [*world.parties.values(), *([world.active] if world.active is not None else [])]:
        module.zero_grad(set_to_none=True)
    for role, state in states.items():
        world.generators[role].set_state(state)


def predict_split(world: World, data: HostedData) -> Tensor | None:
    """SNIS predictions for every row of a split, in evaluation batches (active party only)."""
    world.reseed(stream=99)
    outputs = []
    for start in range(0, data.n, world.cfg.eval_batch_size):
        out = predict(world, data.batch(np.arange(start, min(start + world.cfg.eval_batch_size, data.n))))
        if out is not None:
            outputs.append(out)
    return torch.cat(outputs) if outputs else None


def evaluate(world: World, data: HostedData) -> float | None:
    """Accuracy in percent (classification) or RMSE (regression) at the active party."""
    out = predict_split(world, data)
    if out is None:
        return None
    if world.cfg.task == "classification":
        return 100.0 * (out.argmax(-1) == data.y).double().mean().item()
    return (out - data.y.to(out.dtype)).pow(2).mean().sqrt().item()


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def common_progress(checkpointers: list, agree=None) -> tuple[int, int] | None:
    """The latest (stage, epoch) that every hosted party has a checkpoint of; `agree` combines
    the answer across processes (distributed runtime), None when there is nothing to resume."""
    from .checkpoint import progress_key

    sets = [set(c.available()) for c in checkpointers]
    common = set.intersection(*sets) if sets else set()
    if agree is not None:
        common = agree(common)
    return max(common, key=lambda k: progress_key(*k)) if common else None


def run_training(world: World, data: HostedData, checkpoint_dir=None, resume: bool = False,
                 progress: bool = True, agree=None, after_epoch=None,
                 seconds: dict | None = None) -> tuple[list[float], list[float]]:
    """Both stages, with a per-party checkpoint at the end of every epoch when `checkpoint_dir` is
    given; `resume` continues from the last epoch that every party completed. `seconds`, when given,
    receives the wall time of each stage ("pretrain", "train")."""
    from .checkpoint import Checkpointer, party_state, restore_party

    checkpointers = ([Checkpointer(checkpoint_dir, k) for k in world.parties] if checkpoint_dir is not None else [])
    opt1, opt2 = stage1_optimizers(world), stage2_optimizers(world)
    start1 = start2 = 0
    if resume and checkpointers:
        found = common_progress(checkpointers, agree)
        if found is not None:
            stage, epoch = found
            for c in checkpointers:
                restore_party(world, c.party, c.load(stage, epoch), opt1 if stage == 1 else opt2)
            start1, start2 = (epoch + 1, 0) if stage == 1 else (world.cfg.pretrain.epochs, epoch + 1)

    def saver(stage: int, optimizers: dict):
        def on_epoch_end(epoch: int, _optimizers: dict) -> None:
            for c in checkpointers:
                c.save(stage, epoch, party_state(world, c.party, optimizers))
            if after_epoch is not None:
                after_epoch(stage, epoch)
        return on_epoch_end

    clock = Stopwatch()
    stage1 = pretrain(world, data, start_epoch=start1, optimizers=opt1, progress=progress,
                      on_epoch_end=saver(1, opt1))
    stage1_end = clock()
    stage2 = train_discriminator(world, data, start_epoch=start2, optimizers=opt2, progress=progress,
                                 on_epoch_end=saver(2, opt2))
    if seconds is not None:
        seconds.update(pretrain=round(stage1_end, 3), train=round(clock() - stage1_end, 3))
    return stage1, stage2
