"""The two training stages and evaluation, readable top to bottom.

Stage 1 maximises the IWAE bound on every training sample (labeled or not, aligned or not) over the
generative parameters of every party and of the active party. Stage 2 freezes all of them and maximises
the conditional bound over the discriminator, on labeled samples only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .config import Stage
from .data import PartyView
from .errors import InputError
from .node import Batch, Node
from .placement import Active, apply
from .randomness import public_rng
from .steps import predict, stage1_loss, stage2_loss

EpochHook = Callable[[Stage, int, dict], None]


@dataclass
class HostedData:
    """A split as this process holds it, as tensors: its parties' blocks and held rows and, at the active
    party, the number of observed parties per row and the labels. `labeled_index` is public.

    `observed`: the observed-cell masks (N, d_k) of the parties that have an empty cell in a row they
    hold (a party without an entry observes every cell: its models compute as without the cell path);
    `record_keys`: (N, 32) uint8 per-record keys for repeatable predictions, or None (see `PartyView`)."""

    n: int
    x: dict[int, Tensor]
    held: dict[int, Tensor]
    n_observed: Active[Tensor]
    y: Active[Tensor]
    labeled_index: np.ndarray
    observed: dict[int, Tensor] = field(default_factory=dict)
    record_keys: np.ndarray | None = None

    def batch(self, rows: np.ndarray) -> Batch:
        rows = np.asarray(rows, dtype=np.int64)
        index = torch.from_numpy(rows).to(next(iter(self.x.values())).device)
        return Batch(x={k: v.index_select(0, index) for k, v in self.x.items()},
                     held={k: v.index_select(0, index) for k, v in self.held.items()},
                     n_observed=self.n_observed.map(lambda t: t.index_select(0, index)),
                     y=self.y.map(lambda t: t.index_select(0, index)),
                     observed={k: v.index_select(0, index) for k, v in self.observed.items()},
                     record_keys=None if self.record_keys is None else self.record_keys[rows])


def _host_block(k: int, block: np.ndarray, held: np.ndarray, observed: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """Party k's block with its unobserved cells mean-imputed (0), and its cell mask where it has an
    empty cell in a row it holds (else None); bad values and shapes refused, naming the party."""
    if observed is not None:
        observed = np.asarray(observed)
        if observed.dtype != bool or observed.shape != block.shape:
            raise InputError(f"party {k}: its observed-cell mask must be bool of shape {block.shape}, "
                             f"got {observed.dtype} {observed.shape}")
        empty = held & ~observed.any(axis=1)
        if empty.any():
            raise InputError(f"party {k}: {int(empty.sum())} rows it holds have no observed cell "
                             f"(first: row {int(np.flatnonzero(empty)[0])}); a block with every cell empty "
                             "is a block the party does not hold")
        block = np.where(observed, block, np.float32(0.0))
        observed = observed if (held[:, None] & ~observed).any() else None
    if not np.isfinite(block).all():
        raise InputError(f"party {k}: its feature block contains NaN or inf values")
    return np.ascontiguousarray(block), observed


def _record_keys(view: PartyView) -> np.ndarray | None:
    """The view's record keys, checked: (N, 32) uint8, and at the active party a key for every row."""
    keys = view.record_keys
    if keys is None:
        return None
    keys = np.asarray(keys)
    if keys.dtype != np.uint8 or keys.shape != (view.n, 32):
        raise InputError(f"record keys must be uint8 of shape ({view.n}, 32), got {keys.dtype} {keys.shape}")
    if view.labels is not None and view.n and not keys.any(axis=1).all():
        raise InputError(f"the active party has no record key for {int((~keys.any(axis=1)).sum())} rows; "
                         "repeatable predictions need one per row")
    return np.ascontiguousarray(keys)


def host_split(view: PartyView, device: torch.device, n_classes: int | None = None) -> HostedData:
    """The tensors of what a process holds of a split, validated."""
    x, held, cells = {}, {}, {}
    for k, (block, held_rows) in view.blocks.items():
        held_rows = np.asarray(held_rows, dtype=bool)
        block, observed = _host_block(k, block, held_rows, (view.observed or {}).get(k))
        x[k] = torch.as_tensor(block, dtype=torch.float32, device=device)
        held[k] = torch.as_tensor(held_rows, device=device)
        if observed is not None:
            cells[k] = torch.as_tensor(observed, device=device)
    n_observed, y = Active.absent(), Active.absent()
    if view.labels is not None:
        observed, labels = view.labels.n_observed, np.asarray(view.labels.y)
        if view.n and observed.min() == 0:
            raise InputError(f"{int((observed == 0).sum())} samples have no observed party; "
                             "the split must apply the empty-row rule first")
        if n_classes is not None and labels.size and (labels.min() < 0 or labels.max() >= n_classes):
            raise InputError(f"labels must lie in 0..{n_classes - 1}; got {labels.min()}..{labels.max()}")
        n_observed = Active(torch.as_tensor(observed, dtype=torch.float32, device=device))
        y = Active(torch.as_tensor(labels, device=device))
    return HostedData(view.n, x, held, n_observed, y, np.asarray(view.labeled_index), cells, _record_keys(view))


def epoch_batches(rows: np.ndarray, batch_size: int, seed: int, stage: Stage, epoch: int) -> list[np.ndarray]:
    """The shuffled mini-batches of one epoch; every process derives the same (public) order from the seed."""
    order = rows[public_rng(seed, int(stage), epoch).permutation(len(rows))]
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def optimizers_for(node: Node, stage: Stage) -> dict[str, torch.optim.Optimizer]:
    """One Adam per role and stage, so each party keeps (and checkpoints) only its own optimiser state.
    Stage 1 trains every generative parameter; stage 2 the discriminator only."""
    settings = node.cfg.schedule(stage)

    def adam(params) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)

    if stage is Stage.TRAIN:
        label_side = node.active.map(lambda role: {"discriminator": adam(role.model.discriminator.parameters())})
        return label_side.get() if label_side.present else {}
    optimizers = {f"party{k}": adam(role.model.parameters()) for k, role in node.parties.items()}
    if node.active.present:
        optimizers["active"] = adam(node.active.get().model.generative_parameters())
    return optimizers


def _step(node: Node, batch: Batch, stage: Stage, optimizers: dict) -> Active[Tensor]:
    """One optimiser step of `stage`; the loss at the active party."""
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    if stage is Stage.PRETRAIN:
        loss = stage1_loss(node, batch)
        node.transport.backward(loss)  # every process runs the adjoint rounds
    else:
        loss = stage2_loss(node, batch)
        loss.map(Tensor.backward)  # the discriminator's gradient never leaves the active party
    for opt in optimizers.values():
        opt.step()
    return loss


def run_stage(node: Node, data: HostedData, stage: Stage, optimizers: dict, start_epoch: int = 0,
              progress: bool = True, on_epoch_end: EpochHook | None = None) -> list[float]:
    """Train one stage from `start_epoch`; the mean loss per epoch (NaN where the active party is not hosted)."""
    cfg, settings = node.cfg, node.cfg.schedule(stage)
    rows = np.arange(data.n) if stage is Stage.PRETRAIN else data.labeled_index
    if stage is Stage.TRAIN and len(rows) == 0:
        raise InputError("stage 2 needs labeled samples; the training split has none")
    for module in node.modules():
        module.train()
    history = []
    desc = "stage 1 (IWAE pretraining)" if stage is Stage.PRETRAIN else "stage 2 (discriminator)"
    bar = tqdm(range(start_epoch, settings.epochs), desc=desc, disable=not progress, initial=start_epoch,
               total=settings.epochs, unit="ep")
    for epoch in bar:
        losses = [(_step(node, data.batch(b), stage, optimizers), len(b))
                  for b in epoch_batches(rows, settings.batch_size, cfg.seed, stage, epoch)]
        history.append(_epoch_mean(losses, stage, epoch))
        bar.set_postfix(loss=f"{history[-1]:.3f}")
        if on_epoch_end is not None:
            on_epoch_end(stage, epoch, optimizers)
    return history


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
    """The rounds of one stage-1 step (forward and backward) on the first mini-batch of epoch 0, leaving
    every parameter and random stream as it was: the step `--audit` records. Its traffic is counted."""
    states = [rand.state() for rand in node.randomness()]
    rows = epoch_batches(np.arange(data.n), node.cfg.pretrain.batch_size, node.cfg.seed, Stage.PRETRAIN, 0)[0]
    node.transport.backward(stage1_loss(node, data.batch(rows)))
    for module in node.modules():
        module.zero_grad(set_to_none=True)
    for rand, state in zip(node.randomness(), states, strict=True):
        rand.restore(state)


def predict_split(node: Node, data: HostedData) -> Active[Tensor]:
    """SNIS predictions for every row of a split, in evaluation batches (at the active party). With record
    keys a row's prediction does not depend on the batch it is in or on earlier predictions (up to the
    float rounding of batched products); without, the roles' prediction streams restart here."""
    node.restart_noise(Stage.PREDICT)
    size = node.cfg.eval_batch_size
    outputs = [predict(node, data.batch(np.arange(start, min(start + size, data.n))))
               for start in range(0, data.n, size)]
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


def time_split(total: float, rounds: float, waiting: float) -> dict[str, float]:
    """A stage's wall time as compute (outside the rounds), protocol (in rounds, not waiting) and network."""
    return {"compute_s": round(total - rounds, 3), "protocol_s": round(rounds - waiting, 3),
            "network_s": round(waiting, 3)}


Agree = Callable[[set], set]  # combines the resumable epochs across processes (distributed runtime)


def fit(node: Node, data: HostedData, checkpoint_dir: Path | str | None = None, resume: bool = False,
        progress: bool = True, agree: Agree | None = None, after_epoch: EpochHook | None = None) -> Fit:
    """Both stages, with each hosted party's checkpoint at the end of every epoch when `checkpoint_dir` is
    given; `resume` continues from the last epoch that every party completed."""
    from .checkpoint import Checkpointer, party_state

    checkpointers = [Checkpointer(checkpoint_dir, k) for k in node.parties] if checkpoint_dir is not None else []
    optimizers = {stage: optimizers_for(node, stage) for stage in (Stage.PRETRAIN, Stage.TRAIN)}
    start = _resume(node, checkpointers, optimizers, agree) if resume else {Stage.PRETRAIN: 0, Stage.TRAIN: 0}
    for c in checkpointers if not resume else []:
        c.clear()  # an earlier run's files would outrank this run's in the keep-the-latest rule

    def on_epoch_end(stage: Stage, epoch: int, opts: dict) -> None:
        for c in checkpointers:
            c.save((stage, epoch), party_state(node, c.party, opts))
        if after_epoch is not None:
            after_epoch(stage, epoch, opts)

    result = Fit()
    for stage in (Stage.PRETRAIN, Stage.TRAIN):
        began, (rounds, waiting) = time.perf_counter(), node.transport.log.totals()
        result.losses[stage.key] = run_stage(node, data, stage, optimizers[stage], start[stage], progress,
                                             on_epoch_end)
        result.seconds[stage.key] = round(time.perf_counter() - began, 3)
        after = node.transport.log.totals()
        result.split[stage.key] = time_split(result.seconds[stage.key], after[0] - rounds, after[1] - waiting)
    return result


def _resume(node: Node, checkpointers: list, optimizers: dict, agree: Agree | None) -> dict[Stage, int]:
    """Restore every hosted party from the latest epoch all parties completed; the epochs to start from."""
    from .checkpoint import progress_key, restore_party

    common = set.intersection(*(set(c.available()) for c in checkpointers)) if checkpointers else set()
    common = agree(common) if agree is not None else common
    if not common:
        raise InputError("--resume: there is no checkpoint that every party completed; nothing to resume")
    stage, epoch = max(common, key=progress_key)
    for c in checkpointers:
        restore_party(node, c.party, c.load((stage, epoch)), optimizers[stage])
    if stage is Stage.PRETRAIN:
        return {Stage.PRETRAIN: epoch + 1, Stage.TRAIN: 0}
    return {Stage.PRETRAIN: node.cfg.pretrain.epochs, Stage.TRAIN: epoch + 1}
