"""What one process hosts: some parties, maybe the active party's label side, a transport and the method.

In the local runtime a single `Node` hosts every party and the active party; in the distributed runtime
each process hosts one party (the active party's process also hosts the label side). The methods
(`methods/`, FALSE-VFL's steps in `methods/false_vfl_steps.py`) are written against this object only, so
every runtime runs the same code. Each party draws its initial weights and its noise from its own secret streams
(`randomness`): nothing here follows from the public seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .config import Config, Stage
from .data import PartyView
from .errors import InputError
from .model import PartyStack
from .model.party import Noise
from .model.private_sgd import PrivateGradients
from .model.trees import TreesHead
from .placement import Active
from .randomness import RecordNoise, RoleRandomness, SharedNoise
from .transport.base import Transport


def flush_denormals() -> None:
    """Floats below the smallest normal become zero on this thread and the threads it starts after (x86
    FTZ/DAZ; elsewhere nothing): under a privacy budget the noised sums drive some gradients down there, and
    float32 products over denormal numbers made a stage-1 backward 409 ms instead of 81 (bench/overhead.py
    --privacy's step, one process). Each entry (`simulate`, every role's `run_role`) calls it before its first
    product, and every run again where it resolves its device and builds its node (x86 keeps it per thread,
    and a thread inherits it only when it starts)."""
    torch.set_flush_denormal(True)


def resolve_device(name: str) -> torch.device:
    flush_denormals()  # before this process's first product starts its worker threads
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise InputError(f"unknown device {name!r}; choose auto, cpu or cuda")
    return torch.device(name)


@dataclass
class PartyRole:
    """One party: its networks (the method's party module) and its secret randomness."""

    index: int
    model: nn.Module
    randomness: RoleRandomness

    def noise(self, stage: Stage, repeatable: bool = False) -> Noise:
        """This party's noise stream for `stage`; a repeatable prediction draws one secret (S, 1, d_k)
        block afresh for every batch and shares it by all rows (`SharedNoise`): nothing depends on the
        batch, and nothing new is needed from another party."""
        if repeatable and stage is Stage.PREDICT:
            return SharedNoise(self.randomness.secret.stream("party/noise/predict/shared"))
        return self.randomness.stream(f"party/noise/{stage.key}")


@dataclass
class ActiveRole:
    """The active party's label side (FALSE-VFL: the global encoder and decoder and the discriminator; a
    baseline: its fusion model) and its randomness."""

    model: nn.Module
    randomness: RoleRandomness
    class_weights: Tensor | None = None  # stage 2's weight per class (`class_weight = "balanced"`), or None
    trees: TreesHead | None = None  # `head = "network+trees"`, once fitted after stage 2

    def noise(self, stage: Stage, record_keys: np.ndarray | None = None) -> Noise:
        """The active party's noise for `stage`; a prediction with record keys draws each row's latent
        and z noise from that row's own stream (`RecordNoise`: the secret and the row's key only)."""
        if record_keys is not None and stage is Stage.PREDICT:
            return RecordNoise(self.randomness.secret, "active/noise", record_keys)
        return self.randomness.stream(f"active/noise/{stage.key}")


@dataclass
class Batch:
    """One mini-batch as this process holds it: its parties' blocks and held-row masks, and at the
    active party the number of observed parties per row and the labels; the observed-cell masks of
    the parties that have empty cells, and the rows' record keys (repeatable predictions) or None.
    Public, where a method needs them: `patterns` (B, K) bool, which parties hold each row (a simulation's
    split is public), and `subsets` (T, K) bool, the subsets of parties a LASER-VFL step fuses."""

    x: dict[int, Tensor]
    held: dict[int, Tensor]
    n_observed: Active[Tensor]
    y: Active[Tensor]
    observed: dict[int, Tensor] = field(default_factory=dict)
    record_keys: np.ndarray | None = None
    patterns: np.ndarray | None = None
    subsets: np.ndarray | None = None
    own_extra: Active[Tensor] = field(default_factory=Active.absent)  # the active party's extra own inputs
    orphans: bool = False  # a party left the run: a row may have no observed party left (it trains nothing)

    @property
    def size(self) -> int:
        return next(iter(self.held.values())).shape[0]


@dataclass
class Node:
    cfg: Config
    parties: dict[int, PartyRole]
    active: Active[ActiveRole]
    transport: Transport
    device: torch.device
    stack: PartyStack | None = None  # the hosted parties as batched products (local runtime, CUDA)
    method: Any = None  # the methods.Method that trains and predicts (set by methods.build_node)
    private: dict[int, PrivateGradients] = field(default_factory=dict)  # DP-SGD per hosted party (privacy only)

    def privatize(self) -> None:
        """Under a privacy budget, each hosted party's gradients become its DP-SGD update (after backward)."""
        for gradients in self.private.values():
            gradients.privatize()

    def forget_private(self) -> None:
        """Drop what DP-SGD's hooks kept of a step that will not update (abandoned, or a probe)."""
        for gradients in self.private.values():
            gradients.reset()

    def cells(self, batch: Batch) -> dict[int, Tensor]:
        """The observed-cell masks the party models see: the batch's under cell_handling "mask"; none
        under "mean", where the empty cells are the mean-imputed values of the data and count as observed."""
        return batch.observed if self.cfg.cell_handling == "mask" else {}

    def posterior_contributions(self, batch: Batch) -> dict[int, Tensor]:
        """Each hosted party's posterior contribution, computed from its own block only (with `encode_missing =
        "zeros"` also for the rows it does not hold, whose block is zeros: MIWAE's convention)."""
        cells = self.cells(batch)
        held = batch.held
        if self.method.encodes_missing_blocks:
            held = {k: torch.ones_like(h) for k, h in held.items()}
        if self.stack is not None:
            return self.stack.posterior_contributions(batch.x, held, cells)
        return {k: role.model.posterior_contribution(batch.x[k], held[k], cells.get(k))
                for k, role in self.parties.items()}

    def likelihood_contributions(self, h: Mapping[int, Tensor], batch: Batch, stage: Stage) -> dict[int, Tensor]:
        """Each hosted party's log-likelihood contribution for its copy h[k] of the latent samples."""
        noise = {k: role.noise(stage, batch.record_keys is not None) for k, role in self.parties.items()}
        cells = self.cells(batch)
        if self.stack is not None:
            terms = self.stack.log_likelihood_contributions(h, batch.x, batch.held, noise, cells)
        else:
            terms = {k: role.model.log_likelihood_contribution(h[k], batch.x[k], batch.held[k], noise[k], cells.get(k))
                     for k, role in self.parties.items()}
        if not self.cfg.privacy.enabled:
            return terms
        # Under DP each row is centred over the samples before it is clipped: the importance weights ignore a
        # row's constant, so the gradients are unchanged (the constant is detached) and the clip bounds what varies.
        return {k: t - t.mean(0, keepdim=True).detach() for k, t in terms.items()}

    def modules(self) -> list[nn.Module]:
        label_side = [self.active.get().model] if self.active.present else []
        return [*(role.model for role in self.parties.values()), *label_side]

    def randomness(self) -> list[RoleRandomness]:
        return [role.randomness for role in self.parties.values()]

    def restart_noise(self, stage: Stage) -> None:
        """Restart every hosted role's noise for `stage` (evaluation: the same draws however long training ran)."""
        for rand in self.randomness():
            rand.restart(f"party/noise/{stage.key}")
            rand.restart(f"active/noise/{stage.key}")


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
    patterns: np.ndarray | None = None  # public (N, K) holders, where public (see `PartyView`)
    # The active party's extra inputs to its discriminator (N, e), values of its own (reference.py)
    own_extra: Active[Tensor] = field(default_factory=Active.absent)
    dropped: set[int] = field(default_factory=set)  # parties that left a run that goes on without them
    _holders: tuple | None = field(default=None, repr=False)  # (patterns, n_observed) before any party left

    def drop_parties(self, lost: Iterable[int]) -> None:
        """Parties that left a run that goes on: from now on they hold no row (see `set_dropped`)."""
        self.set_dropped(self.dropped | set(lost))

    def set_dropped(self, out: Iterable[int]) -> None:
        """The parties out of the run now: they hold no row, and a party that rejoined holds its rows again. At
        the active party each row's count of observed parties leaves out the parties out where they held it
        (from the public holders, `patterns`); a row no party holds any more counts 0 and trains nothing."""
        out = set(out)
        if out == self.dropped:
            return
        if self.n_observed.present and self.patterns is None:
            raise InputError("the run cannot go on without a lost party here: the active party does not know "
                             "which rows it held")
        if self.patterns is not None:
            if self._holders is None:
                self._holders = (self.patterns, self.n_observed)
            patterns, n_observed = self._holders
            gone = torch.from_numpy(patterns[:, sorted(out)].sum(axis=1).astype(np.int64))
            self.n_observed = n_observed.map(lambda t: t - gone.to(t))
            self.patterns = patterns.copy()
            self.patterns[:, sorted(out)] = False
        self.dropped = out

    def batch(self, rows: np.ndarray) -> Batch:
        rows = np.asarray(rows, dtype=np.int64)
        index = torch.from_numpy(rows).to(next(iter(self.x.values())).device)
        return Batch(x={k: v.index_select(0, index) for k, v in self.x.items()},
                     held={k: v.index_select(0, index) for k, v in self.held.items()},
                     n_observed=self.n_observed.map(lambda t: t.index_select(0, index)),
                     y=self.y.map(lambda t: t.index_select(0, index)),
                     observed={k: v.index_select(0, index) for k, v in self.observed.items()},
                     record_keys=None if self.record_keys is None else self.record_keys[rows],
                     patterns=None if self.patterns is None else self.patterns[rows],
                     own_extra=self.own_extra.map(lambda t: t.index_select(0, index)), orphans=bool(self.dropped))


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
    patterns = None if view.patterns is None else np.asarray(view.patterns, dtype=bool)
    return HostedData(view.n, x, held, n_observed, y, np.asarray(view.labeled_index), cells, _record_keys(view),
                      patterns)
