"""The contract of a learning method: everything the trainer, the runtimes, the checkpoints and the
federation ask of one, stated once here (in the spirit of `torch.distributions.Distribution`: the base
class states the whole contract, a subclass declares what differs).

A method declares its round table (per stage, the rounds of one step and of each epoch's end, as
aggregate/broadcast pairs of `transport.rounds.VOCABULARY`), builds its party-side and active-side
modules, computes its loss for a batch of any subset of observed parties and its predictions, names its
optimiser groups and what a checkpoint holds. Training is the same loop for every method (`train.py`):
a stage's batches (`plan`, `batch`), then per step `loss` and `transport.backward`, then `end_epoch`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from torch import Tensor, nn

from ..config import Config, Stage
from ..errors import InputError
from ..placement import Active
from ..randomness import PublicStream, RoleRandomness, public_rng
from ..transport.rounds import RoundTable

if TYPE_CHECKING:
    from ..node import Batch, HostedData, Node


@dataclass
class Objective:
    """What one step optimises, where it lives: `active`, the loss at the active party (its gradient goes
    back through the adjoint rounds), and `local`, each hosted party's own loss, which never leaves it (a
    self-supervised objective on its own rows)."""

    active: Active[Tensor]
    local: dict[int, Tensor] = field(default_factory=dict)

    def reported(self, active_index: int) -> Active[Tensor]:
        """The step's number at the active party: its loss plus its own local loss (detached)."""
        own = self.local.get(active_index)
        return self.active.map(lambda loss: loss.detach() + (own.detach() if own is not None else 0.0))


class Method:
    """A learning method. Subclasses set the class attributes and implement the four abstract methods;
    every other method has a default that fits most.

    Class attributes:
      name: the method's name in `Config.method`.
      rounds: its `RoundTable`.
      variants: subclasses with other round tables that a configuration option selects (`configured`).
      needs_patterns: its training rows or batches depend on which parties hold each row (Vanilla VFL
        and FedHSSL train on the rows every party holds, LASER-VFL groups rows by their observed set),
        so those patterns must be public (a simulation's split is).
      stackable: the local runtime may evaluate its party networks as batched products (`PartyStack`).
      probe_stages: the stages whose first step (and end-of-epoch rounds) `simulate --audit` records.
      row_rule: per training stage, which rows it trains on (in words, for errors).
      survives_party_loss: training may go on without a passive party that left (`runtime.losses`).
    """

    name: ClassVar[str]
    rounds: ClassVar[RoundTable]
    survives_party_loss: ClassVar[bool] = False  # its steps treat a party that left as one holding no row
    variants: ClassVar[tuple[type[Method], ...]] = ()  # subclasses a configuration option selects (`configured`)
    needs_patterns: ClassVar[bool] = False
    stackable: ClassVar[bool] = False
    probe_stages: ClassVar[tuple[Stage, ...]] = (Stage.PRETRAIN,)
    # Stage 2 trains the active party's parameters only and predicts through `steps.forward_rounds`, so the
    # active party alone may keep its best epoch on validation records (selection.py)
    selects_locally: ClassVar[bool] = False
    row_rule: ClassVar[dict[Stage, str]] = {Stage.PRETRAIN: "every row", Stage.TRAIN: "the labeled rows"}

    @classmethod
    def configured(cls, cfg: Config) -> Method:
        """The method (or the variant of it) that `cfg` trains."""
        return cls()

    def probe_sums(self) -> int:
        """How many sums the probe stages' steps and end-of-epoch rounds run (what the he aggregator records)."""
        table = self.rounds
        return sum(r.is_aggregate for stage in self.probe_stages
                   for r in (*table.step(stage), *table.epoch_end.get(stage, ())))

    # -- what every method provides ---------------------------------------------------------------------

    def build_party(self, cfg: Config, width: int, randomness: RoleRandomness, layout=None) -> nn.Module:
        """Party networks for a block of `width` features (`layout`: its cells' kinds, model.likelihood;
        None: all numeric), initial weights from the party's secret."""
        raise NotImplementedError

    def build_active(self, cfg: Config, n_classes: int, randomness: RoleRandomness, own_width: int = 0,
                     own_extra: int = 0) -> nn.Module:
        """The active party's label side (`own_width`: its own block's width, `own_extra`: the width of its own
        extra inputs, for methods that read them), initial weights from its secret."""
        raise NotImplementedError

    def loss(self, node: Node, batch: Batch, stage: Stage) -> Objective:
        """The objective of one training step of `stage` on `batch` (its rounds are the table's step)."""
        raise NotImplementedError

    def predict(self, node: Node, batch: Batch) -> Active[Tensor]:
        """Predictions at the active party: class probabilities (B, C), or (B,) means for regression."""
        raise NotImplementedError

    def parameters(self, node: Node, stage: Stage) -> dict[str, Iterable[nn.Parameter]]:
        """The parameters `stage` trains, by optimiser: "party<k>" for party k's own, any other name for the
        active party's label side (each role keeps and checkpoints only its own optimisers)."""
        raise NotImplementedError

    # -- defaults ---------------------------------------------------------------------------------------

    def rows(self, stage: Stage, data: HostedData) -> np.ndarray:
        """The rows `stage` trains on (public): every row in stage 1, the labeled rows in stage 2."""
        return np.arange(data.n) if stage is Stage.PRETRAIN else np.asarray(data.labeled_index)

    def plan(self, stage: Stage, data: HostedData, epoch: int, seed: int, batch_size: int) -> list[np.ndarray]:
        """The epoch's mini-batches (row numbers), the same at every party: a public shuffle of `rows`."""
        return epoch_batches(self.rows(stage, data), batch_size, seed, stage, epoch)

    def batch(self, data: HostedData, rows: np.ndarray, stage: Stage, epoch: int, index: int, seed: int = 0) -> Batch:
        """Batch `index` of the epoch's plan, as this process holds it (with the public draws it needs)."""
        return data.batch(rows)

    def prepare(self, node: Node, data: HostedData) -> None:
        """Before training: statistics each party takes of its own training rows (none by default)."""

    def wire_sizes(self, cfg: Config, rows: int = 0) -> dict[str, int]:
        """The largest value of each size name of this method's round payloads (B batch rows, S samples, H the
        latent width, E an embedding width, T subsets, P model parameters): the network's frame bounds.
        `rows`: a batch larger than the configured ones (a test's single step)."""
        batch = max(cfg.pretrain.batch_size, cfg.train.batch_size, cfg.eval_batch_size, rows)
        return {"B": batch, "S": max(cfg.kappa, cfg.predict_samples), "H": cfg.h_dim, "E": cfg.h_dim,
                "T": cfg.parties, "P": 1}

    def end_epoch(self, node: Node, stage: Stage) -> None:
        """The rounds at the end of every epoch of `stage` (the table's `epoch_end`; none by default)."""

    def checkpoint_modules(self, node: Node, party: int) -> dict[str, nn.Module]:
        """What party `party`'s checkpoint and saved model hold, by name: its own module, and at the active
        party its label side."""
        modules = {"party_module": node.parties[party].model}
        if party == node.cfg.active_index and node.active.present:
            modules["active_module"] = node.active.get().model
        return modules


def epoch_batches(rows: np.ndarray, batch_size: int, seed: int, stage: Stage, epoch: int) -> list[np.ndarray]:
    """The shuffled mini-batches of one epoch; every process derives the same (public) order from the seed."""
    order = rows[public_rng(seed, PublicStream.BATCH_ORDER, int(stage), epoch).permutation(len(rows))]
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def patterns_of(data: HostedData, method: str) -> np.ndarray:
    """The public (N, K) holders of every row; a clear error where they are not public (a federation)."""
    if data.patterns is None:
        raise InputError(f"method {method!r} needs to know which parties hold each training row (its batches "
                         "depend on it); only a simulation's split makes that public")
    return data.patterns
