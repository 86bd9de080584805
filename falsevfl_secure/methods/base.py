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

from collections.abc import Iterable, Mapping
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


@dataclass(frozen=True)
class Option:
    """One setting of a method's own section of the configuration (`Config.options`): its choices (the first is
    the default) and what it means, in words (the command line's help)."""

    choices: tuple
    help: str

    @property
    def default(self):
        return self.choices[0]


METHODS: dict[str, type[Method]] = {}


def register(method: type[Method]) -> type[Method]:
    """Add a method to the registry under its name (timm's `register_model`: the module registers itself)."""
    if method.name in METHODS and METHODS[method.name] is not method:
        raise ValueError(f"a method named {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def method_named(name: str) -> type[Method]:
    """The registered method of that name; an unknown name is refused, listing the registered ones."""
    if name not in METHODS:
        raise InputError(f"method={name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name]


def owner_of(option: str) -> str | None:
    """The registered methods that declare `option` (for errors that name them: "vanilla's or plugvfl's"),
    if any."""
    owners = [f"{m.name}'s" for m in METHODS.values() if option in m.options]
    return " or ".join(owners) if owners else None


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
      labels: the names `--method` and `[model] method` take, each with the options it sets (default: the name).
      options: the method's own settings (`Config.options`), each an `Option`.
      schedules: per dataset and preset, the settings of its schedule (None: the dataset's presets are its own).
      private: it may train under a privacy budget (its summed rounds are the ones the budget accounts).
    """

    name: ClassVar[str]
    rounds: ClassVar[RoundTable]
    labels: ClassVar[dict[str, dict]]
    options: ClassVar[dict[str, Option]] = {}
    schedules: ClassVar[dict[str, dict[str, dict]] | None] = None
    private: ClassVar[bool] = False
    survives_party_loss: ClassVar[bool] = False  # its steps treat a party that left as one holding no row
    variants: ClassVar[tuple[type[Method], ...]] = ()  # subclasses a configuration option selects (`configured`)
    needs_patterns: ClassVar[bool] = False
    stackable: ClassVar[bool] = False
    probe_stages: ClassVar[tuple[Stage, ...]] = (Stage.PRETRAIN,)
    # Stage 2 trains the active party's parameters only and predicts through `false_vfl_steps.forward_rounds`, so the
    # active party alone may keep its best epoch on validation records (selection.py)
    selects_locally: ClassVar[bool] = False
    row_rule: ClassVar[dict[Stage, str]] = {Stage.PRETRAIN: "every row", Stage.TRAIN: "the labeled rows"}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and "labels" not in cls.__dict__:
            cls.labels = {cls.name: {}}
        for presets in (cls.schedules or {}).values():
            presets.setdefault("default", presets["paper"])

    def __init__(self, options: Mapping[str, object] | None = None) -> None:
        self.settings = self.resolve(options or {})  # every option of the method, defaults filled in

    @classmethod
    def configured(cls, cfg: Config) -> Method:
        """The method (or the variant of it) that `cfg` trains."""
        return cls(cfg.options)

    @property
    def label(self) -> str:
        """The method's name as `--method` takes it: the first label whose options this one has."""
        return next(label for label, implied in self.labels.items()
                    if all(self.settings.get(k) == v for k, v in implied.items()))

    @classmethod
    def resolve(cls, options: Mapping[str, object]) -> dict[str, object]:
        """The method's options with the defaults filled in; an option it does not declare, or a value outside
        an option's choices, is refused by name."""
        for name, value in options.items():
            if name not in cls.options:
                owner = owner_of(name)
                raise InputError(f"{name}={value!r} is {owner} option, not {cls.name}'s" if owner else
                                 f"unknown setting {name!r}")
            choices = cls.options[name].choices
            if value not in choices or type(value) is not type(cls.options[name].default):
                raise InputError(f"{name}={value!r}: choose {' or '.join(map(repr, choices))}")
        resolved = {name: options.get(name, option.default) for name, option in cls.options.items()}
        cls.check_options(resolved)
        return resolved

    @classmethod
    def check_options(cls, options: Mapping[str, object]) -> None:
        """Refuse options that do not combine (none by default)."""

    @classmethod
    def schedule(cls, dataset: str, preset: str) -> dict:
        """The settings of the method's schedule for `preset` on `dataset` ({} where the dataset's presets are
        its own); a missing one is an input error, never another method's. `auto` takes the default."""
        if cls.schedules is None:
            return {}
        wanted = "default" if preset == "auto" else preset
        presets = cls.schedules.get(dataset, {})
        if wanted not in presets:
            raise InputError(f"method {cls.name!r} has no {preset!r} schedule for {dataset} (it has: "
                             f"{sorted(presets) or 'none'}); give its schedule explicitly or choose another preset")
        return presets[wanted]

    # Where the active party's discriminator reads its own trees' score (a federation fits them) or the posterior
    # mean, whether it fits its trees after stage 2 (selection.fit_trees), and where a party encodes the blocks
    # it does not hold (as zeros) instead of leaving them out
    reads_own_reference: ClassVar[bool] = False
    own_reference_kinds: ClassVar[tuple[str, ...]] = ()  # which own models score the record (reference.MODELS)
    reads_posterior_mean: ClassVar[bool] = False
    fits_trees: ClassVar[bool] = False
    encodes_missing_blocks: ClassVar[bool] = False
    caches_stage2: ClassVar[bool] = False  # stage 2 runs its rounds once and trains from what they left

    def check(self, cfg: Config) -> None:
        """Refuse a configuration this method cannot train (a privacy budget where it is not `private`)."""
        if cfg.privacy.enabled and not self.private:
            raise InputError(f"privacy: method {self.label!r} is refused under a privacy budget: its summed rounds "
                             "carry label-dependent gradients back to the parties (embedding_grad, subsets_grad) "
                             "that no budget covers yet; run false-vfl-i (latent_broadcast = \"samples\", "
                             "encode_missing = \"skip\": the only method and settings a budget covers)")

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
