"""Run configuration as plain dataclasses, plus named presets per dataset.

The `paper` presets are the paper's Table "Hyperparameters for FALSE-VFL" (stage-1 values in the
paper's parentheses). Hidden widths are not given by the paper; ours are stated here.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import IntEnum

from .data.encoding import NUMERIC
from .data.loaders import STANDARDIZE
from .data.mechanisms import MECHANISM_ROWS, parse_mechanism
from .errors import InputError


class Stage(IntEnum):
    """The stages of a run: one name per stage for training, checkpoints, jobs and protocol specs."""

    PRETRAIN = 1  # stage 1: the IWAE bound over every generative parameter, no labels
    TRAIN = 2  # stage 2: the discriminator only, generative part frozen
    PREDICT = 3  # inference: SNIS predictions

    @property
    def key(self) -> str:
        """The name used in files and specs: "pretrain", "train", "predict"."""
        return self.name.lower()


CELL_HANDLING = ("mask", "mean")  # how party models treat empty cells (Config.cell_handling)

# Settings that do not change what training computes: a checkpoint may be resumed with others.
NOT_TRAINING_SETTINGS = frozenset({"device", "eval_batch_size", "stack_parties"})


MAX_EPOCHS = 100_000  # a stage's epochs: far past any schedule that trains (the paper's is 300)
CLASS_WEIGHTS = ("none", "balanced")  # Config.class_weight: stage 2's weight of each labeled row
OPTIMIZERS = ("adam", "sgd")  # sgd: momentum 0.9, as SimSiam's pretraining uses it


@dataclass(frozen=True)
class StageConfig:
    """Optimiser settings and schedule of one training stage."""

    lr: float
    batch_size: int
    epochs: int
    weight_decay: float = 1e-4
    optimizer: str = "adam"
    # At most this many steps per epoch, the first of the epoch's public plan (0: every batch). A method whose
    # batches are not plain shuffles of its rows (LASER-VFL's grouped batches) then takes the step count the
    # paper's epochs and batch size state: epochs x ceil(rows / batch_size) (the `paper-protocol` preset).
    steps_per_epoch: int = 0

    def check(self, name: str) -> None:
        """Refuse a schedule that cannot run, naming the stage (`name`)."""
        _need(_whole(self.epochs) and 0 <= self.epochs <= MAX_EPOCHS,  # (a trial's 10^20 overflowed the accountant)
              f"{name} epochs={self.epochs!r}: a whole number in 0..{MAX_EPOCHS:,}")
        _need(_whole(self.batch_size) and 1 <= self.batch_size <= MAX_BATCH,
              f"{name} batch_size={self.batch_size!r}: a whole number in 1..{MAX_BATCH}")
        _need(real_number(self.lr) and real_number(self.weight_decay) and self.lr > 0 and self.weight_decay >= 0,
              f"{name}: lr must be a finite number > 0 and weight_decay one >= 0 (got {self.lr!r}, "
              f"{self.weight_decay!r})")
        _need(self.optimizer in OPTIMIZERS, f"{name} optimizer={self.optimizer!r}: choose adam or sgd")
        _need(_whole(self.steps_per_epoch) and self.steps_per_epoch >= 0,
              f"{name} steps_per_epoch={self.steps_per_epoch}: an integer >= 0 (0: every batch of the epoch)")


PRIVACY_BUDGET = ("epsilon", "delta", "max_releases_per_row", "trust_aggregator")  # each party's own, never agreed


@dataclass(frozen=True)
class PrivacyConfig:
    """Differential privacy of what the sums reveal (README "Output privacy"; threat_models/dp.toml). Off
    while `epsilon` is 0. The unit is one party's block of one record; every party clips each row of its
    contribution to a summed round to that round's `clip` norm (L2) and adds its share of discrete Gaussian
    noise, so the revealed sum carries noise of standard deviation `noise_multiplier` x clip even when
    `collusion` parties besides the active party collude with it or drop; each party trains its own networks
    by DP-SGD (each row's gradient clipped to `clip_gradient`, the same multiplier). `noise_multiplier` 0:
    the smallest that keeps every row's releases within (`epsilon`, `delta`), accounted without amplification."""

    epsilon: float = 0.0
    delta: float = 1e-5
    noise_multiplier: float = 0.0
    collusion: int = 0
    # Per-row L2 clip norms of the summed rounds: the posterior's natural parameters, the likelihood's
    # log-densities centred over the samples, the latent gradient's two moments (`federation propose-clips`
    # proposes them from a party's own rows, with DP: clip_proposal.py).
    # Defaults: per-row norms measured on digits (h_dim 32: medians after 10 epochs; the gradient between its
    # median at the start, 18, and after 10 epochs, 131; README "Output privacy").
    clip_posterior: float = 6.0
    clip_likelihood: float = 32.0
    clip_latent_grad: float = 0.04
    clip_gradient: float = 30.0  # DP-SGD: each row's gradient over a party's own parameters
    max_releases_per_row: int = 0  # 0: no cap besides epsilon
    # Under he: whether this party counts on the aggregator pooling every party's ciphertext (he's premise) or
    # counts its releases as under plain, where the active party sees its contribution alone (`privacy.exposure`).
    trust_aggregator: bool = True

    @property
    def enabled(self) -> bool:
        return self.epsilon > 0

    @property
    def clips(self) -> dict[str, float]:
        """The clip norm of each summed round, by the round's name."""
        return {"posterior": self.clip_posterior, "likelihood": self.clip_likelihood,
                "latent_grad": self.clip_latent_grad}

    def check(self, parties: int) -> None:
        _need(real_number(self.epsilon) and real_number(self.delta),
              f"privacy epsilon={self.epsilon!r}, delta={self.delta!r}: finite numbers")
        _need(self.epsilon >= 0, f"privacy epsilon={self.epsilon}: >= 0 (0: off)")
        _need(1e-300 <= self.delta < 1, f"privacy delta={self.delta}: in [1e-300, 1)")  # no denormal: flushed
        low, high = MULTIPLIER_RANGE
        z = self.noise_multiplier
        _need(real_number(z) and (z == 0 or low <= z <= high),
              f"privacy noise_multiplier={self.noise_multiplier!r}: a number in [{low:g}, {high:g}], or 0 (calibrated)")
        _need(_whole(self.collusion) and 0 <= self.collusion <= parties - 2,
              f"privacy collusion={self.collusion}: an integer in 0..{parties - 2} (the noise of at least one "
              "party besides the active one must remain)")
        for name in ("clip_posterior", "clip_likelihood", "clip_latent_grad", "clip_gradient"):
            _need(real_number(getattr(self, name)) and 0 < getattr(self, name) <= MAX_CLIP,
                  f"privacy {name}={getattr(self, name)!r}: a number in (0, {MAX_CLIP:g}]")
        _need(_whole(self.max_releases_per_row) and self.max_releases_per_row >= 0,
              f"privacy max_releases_per_row={self.max_releases_per_row}: an integer >= 0")
        _need(isinstance(self.trust_aggregator, bool), f"privacy trust_aggregator={self.trust_aggregator!r}: "
              "true or false")


# The noise multipliers a run may state: below, epsilon is in the thousands (34 releases at 0.05: 7,300), no privacy
# to speak of, and at the extremes (1e-300) the accountant fails; above, the sampler's scale passes 2^52 grid steps
# at the clip norms allowed. (A multiplier calibrated to an epsilon of thousands may fall below it: harmless.)
MULTIPLIER_RANGE = (0.05, 1e4)
MAX_CLIP = 1e4  # a clip norm's largest: with the largest multiplier, the noise stays inside the sampler's range


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise InputError(message)


def _whole(value) -> bool:
    """An integer, not a bool (TOML's true would read as 1) nor a float (1.5 epochs)."""
    return isinstance(value, int) and not isinstance(value, bool)


def real_number(value) -> bool:
    """A finite number, not a bool (inf and nan pass a comparison with 0 or fail it silently)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


MAX_BATCH = 1 << 20  # rows per mini-batch
MAX_WIDTH = 1 << 14  # a layer's or latent's width (a typo of a few zeros allocated terabytes)
MAX_SAMPLES = 1000  # importance samples in training, samples in prediction


@dataclass(frozen=True)
class Config:
    dataset: str = "digits"
    parties: int = 4
    active_party: int = -1  # -1: the last party
    method: str = "false-vfl"  # a registered method (methods/): FALSE-VFL or a baseline of the paper
    # The method's own settings, by the names it declares (`Method.options`; `methods.make_config` fills in
    # its defaults): FALSE-VFL's variant "I" (MAR) or "II" (MNAR), LASER-VFL's batches, PlugVFL's drops, ...
    options: dict = field(default_factory=dict)
    task: str = "classification"
    train_mechanism: str = "mcar:0.2"
    h_dim: int = 128
    z_dim: int = 64
    party_hidden: int = 256  # party encoder and decoder (2-layer MLPs)
    global_hidden: int = 256  # global encoder and decoder (3-layer MLPs)
    discriminator_hidden: int = 256  # discriminator (2-layer MLP)
    indicator_hidden: int = 64  # FALSE-VFL-II missing indicator (3-layer MLP)
    min_decoder_std: float = 0.05
    # Empty cells inside a block a party holds: "mask" imputes them by the mean and gives the party's
    # encoder the missing-cell indicator, and its likelihood covers the observed cells only (MIWAE's
    # treatment); "mean" imputes them by the mean and treats them as observed (the baseline). With no
    # empty cell both compute exactly the same (the mask input adds a zero-initialised weight only).
    cell_handling: str = "mask"
    cell_missing: float = 0.0  # simulations: the fraction of cells removed at random inside held blocks
    # Simulations: how the dataset's features are treated (data.loaders.STANDARDIZE): "robust" (floored
    # scale, clipped; the default), "zscore" (plain mean and std) or "none" (as the files hold them).
    standardize: str = "robust"
    # Simulations: the training mechanism removes blocks from "all" training rows outside the aligned reserve,
    # or from the "labeled" ones only (the paper: "we reserve 100 ... of the labeled samples as fully aligned
    # and render the remainder partially aligned"); the unlabeled rows then stay fully observed.
    mechanism_rows: str = "all"
    class_weight: str = "none"  # stage 2: "balanced" weighs each labeled row by n / (C n_class) (classification)
    # A federation's tables: each party standardises a numeric column as it is ("standard"), or its normal score
    # ("quantile": the rank among its own training values, data/encoding.py; not released with DP, refused then);
    # "auto" (the tables' preset): "quantile" for a crowded column (data/encoding.py `crowded`), "standard" for the
    # others, and under a privacy budget "standard" as the private encoding releases it.
    numeric_encoding: str = "standard"
    # Stage 2 keeps the discriminator of its best epoch on the validation records (log loss, or RMSE for
    # regression; the active party's own choice: stage 2 trains its parameters only) where a run has them.
    select_best: bool = True
    # A federation: batch sizes and epochs from the table's size (`sized_schedule`), over the stages' rates.
    auto_schedule: bool = False
    kappa: int = 10  # importance samples in training
    predict_samples: int = 50  # L, importance samples for SNIS prediction
    pretrain: StageConfig = field(default_factory=lambda: StageConfig(5e-4, 512, 300))
    train: StageConfig = field(default_factory=lambda: StageConfig(2e-4, 128, 300))
    n_labeled: int | None = None  # None: the dataset's default (500 tabular, 1000 images)
    n_aligned: int | None = None
    max_rows: int | None = None  # a smoke test: at most this many training and test rows (public subsample)
    seed: int = 0
    device: str = "auto"
    # Parties hosted by one process (the local runtime) with equal block widths: "always" evaluates
    # them as batched products (model.party_stack), "never" one network after the other (same
    # results to float rounding), "auto" batches on CUDA only: on the CPU the sequential products
    # measured faster (bench/local_speed.py).
    stack_parties: str = "auto"
    eval_batch_size: int = 500
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    @property
    def active_index(self) -> int:
        """The active party's index (the `active_party` setting may count from the end)."""
        return self.active_party % self.parties

    def schedule(self, stage: Stage) -> StageConfig:
        """The optimiser settings and epochs of a training stage."""
        return {Stage.PRETRAIN: self.pretrain, Stage.TRAIN: self.train}[stage]

    def to_dict(self) -> dict:
        return asdict(self)

    def with_options(self, **options) -> Config:
        """The configuration with some of the method's own options changed."""
        return replace(self, options={**self.options, **options})

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """The inverse of `to_dict`; unknown settings are refused by name."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise InputError(f"unknown settings {unknown}")
        stages = {name: StageConfig(**d[name]) for name in ("pretrain", "train") if name in d}
        if isinstance(d.get("privacy"), dict):
            stages["privacy"] = PrivacyConfig(**d["privacy"])
        return replace(cls(), **{**d, **stages})

    def training_settings(self) -> dict:
        """The settings that determine what training computes (what a checkpoint belongs to)."""
        settings = {k: v for k, v in self.to_dict().items() if k not in NOT_TRAINING_SETTINGS}
        if not self.privacy.enabled:
            del settings["privacy"]  # runs without DP keep the fingerprints they had
        elif self.privacy.noise_multiplier > 0:  # the noise is stated: each party's budget is its own
            settings["privacy"] = {k: v for k, v in settings["privacy"].items() if k not in PRIVACY_BUDGET}
        return settings

    def file_settings(self) -> dict[str, object]:
        """`training_settings` flat, each named as a federation file writes it ("[model.pretrain] lr"): what a
        handshake compares, so that a difference names the setting, not only the fingerprint."""
        flat: dict[str, object] = {}
        for key, value in self.training_settings().items():
            section = {"pretrain": "[model.pretrain]", "train": "[model.train]", "privacy": "[privacy]"}.get(key)
            inner = value if section or key == "options" else {key: value}
            for name, setting in inner.items():
                scalar = setting is None or isinstance(setting, str | int | float | bool)
                flat[f"{section or '[model]'} {name}"] = setting if scalar else json.dumps(setting, sort_keys=True)
        return flat

    def fingerprint(self) -> str:
        """A short hash of `training_settings`, recorded in every checkpoint."""
        text = json.dumps(self.training_settings(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def validate(self) -> Config:
        """Refuse settings that would fail deep inside torch or numpy, with a clear `InputError`."""
        _need(isinstance(self.parties, int) and self.parties >= 2, f"parties={self.parties}: at least 2 are needed")
        _need(-self.parties <= self.active_party < self.parties,
              f"active_party={self.active_party} is not one of the {self.parties} parties")
        self._check_choices()
        _need(isinstance(self.cell_missing, int | float) and 0 <= self.cell_missing < 1,
              f"cell_missing={self.cell_missing}: a fraction in [0, 1)")
        _need(_whole(self.seed) and 0 <= self.seed < 2**32, f"seed={self.seed!r}: a whole number in 0..2^32-1")
        for name in ("select_best", "auto_schedule"):  # (review finding: "no" was taken, and read as true)
            _need(isinstance(getattr(self, name), bool), f"{name}={getattr(self, name)!r}: true or false")
        _need(self.max_rows is None or (isinstance(self.max_rows, int) and self.max_rows >= 10),
              f"max_rows={self.max_rows}: must be at least 10 (or unset)")
        limits = dict.fromkeys(("h_dim", "z_dim", "party_hidden", "global_hidden", "discriminator_hidden",
                                "indicator_hidden"), MAX_WIDTH) | {"kappa": MAX_SAMPLES, "predict_samples": MAX_SAMPLES,
                                                                   "eval_batch_size": MAX_BATCH}
        for name, most in limits.items():
            value = getattr(self, name)
            _need(_whole(value) and 1 <= value <= most, f"{name}={value!r}: a whole number in 1..{most}")
        _need(real_number(self.min_decoder_std) and self.min_decoder_std > 0,
              f"min_decoder_std={self.min_decoder_std!r}: a finite number > 0")
        for stage_name in ("pretrain", "train"):
            getattr(self, stage_name).check(stage_name)
        self.privacy.check(self.parties)
        parse_mechanism(self.train_mechanism)
        return self

    def _check_choices(self) -> None:
        """The settings that name one of a few choices (the method's own options: `Method.resolve`)."""
        _need(isinstance(self.method, str) and isinstance(self.options, dict),
              f"method={self.method!r}, options={self.options!r}: a method's name and a table of its options")
        _need(self.stack_parties in ("auto", "always", "never"),
              f"stack_parties={self.stack_parties!r}: choose auto, always or never")
        _need(self.task in ("classification", "regression"), f"task={self.task!r}: classification or regression")
        _need(self.cell_handling in CELL_HANDLING, f"cell_handling={self.cell_handling!r}: choose mask or mean")
        _need(self.mechanism_rows in MECHANISM_ROWS,
              f"mechanism_rows={self.mechanism_rows!r}: choose {' or '.join(MECHANISM_ROWS)}")
        _need(self.class_weight in CLASS_WEIGHTS, f"class_weight={self.class_weight!r}: choose none or balanced")
        _need(self.class_weight == "none" or self.task == "classification",  # (a trial: silently ignored there)
              f"class_weight={self.class_weight!r} weighs classes: it applies to task = \"classification\" only")
        _need(self.standardize in STANDARDIZE, f"standardize={self.standardize!r}: choose {', '.join(STANDARDIZE)}")
        _need(self.numeric_encoding in NUMERIC,
              f"numeric_encoding={self.numeric_encoding!r}: choose {', '.join(NUMERIC[:-1])} or {NUMERIC[-1]}")
        _need(self.numeric_encoding != "quantile" or not self.privacy.enabled,  # its reference values are the rows'
              f"numeric_encoding={self.numeric_encoding!r} keeps each column's values at 1,000 ranks, which no DP "
              "release covers: under a privacy budget leave numeric_encoding = \"auto\" or \"standard\"")


PRESETS: dict[str, dict[str, dict]] = {
    "isolet": {
        "paper": dict(parties=8, h_dim=128, z_dim=64,
                      pretrain=StageConfig(5e-4, 512, 300), train=StageConfig(2e-4, 128, 300)),
        "quick": dict(parties=8, h_dim=128, z_dim=64,
                      pretrain=StageConfig(5e-4, 512, 30), train=StageConfig(2e-4, 128, 30)),
    },
    "hapt": {
        "paper": dict(parties=8, h_dim=128, z_dim=64,
                      pretrain=StageConfig(2e-3, 512, 500), train=StageConfig(2e-4, 128, 300)),
        "quick": dict(parties=8, h_dim=128, z_dim=64,
                      pretrain=StageConfig(2e-3, 512, 30), train=StageConfig(2e-4, 128, 30)),
    },
    # The paper trains ResNet-18 encoders and transposed-CNN decoders (lr 5e-5, 150 + 200 epochs);
    # on a 2-core CPU we use the MLP parties and a shorter schedule with a larger stage-1 rate.
    "fashion-mnist": {
        "paper": dict(parties=8, h_dim=196, z_dim=32,
                      pretrain=StageConfig(5e-4, 1024, 20), train=StageConfig(2e-4, 128, 200)),
        "quick": dict(parties=8, h_dim=196, z_dim=32,
                      pretrain=StageConfig(5e-4, 1024, 3), train=StageConfig(2e-4, 128, 20)),
    },
    # The embedded default (no paper schedule exists for digits): `make simulate`'s first run, at least 90 %
    # on the fully observed test pattern within 60 s of training on 2 cores. A decoder std floor of 0.2
    # (a fifth of a standardised feature's spread) trained better here than 0.05.
    "digits": {
        "paper": dict(parties=4, h_dim=32, z_dim=16, party_hidden=128, global_hidden=64,
                      discriminator_hidden=128, min_decoder_std=0.2,
                      pretrain=StageConfig(2e-3, 128, 150), train=StageConfig(2e-3, 64, 60)),
        "quick": dict(parties=4, h_dim=32, z_dim=16, party_hidden=64, global_hidden=64,
                      discriminator_hidden=64,
                      pretrain=StageConfig(2e-3, 128, 40), train=StageConfig(2e-3, 64, 60)),
    },
}


# Tables of a federation (`preset = "auto"`, the default there): the digits widths, the active party's own
# columns, its trees' score and the posterior mean in the discriminator (README "Real tables"), the schedule
# sized by the table (`sized_schedule`), crowded numeric columns at their normal scores where no budget refuses them.
PRESETS["digits"]["auto"] = dict(PRESETS["digits"]["paper"], auto_schedule=True, numeric_encoding="auto",
                                 discriminator_inputs="latent+mean+own", own_reference=True, head="network+trees",
                                 pretrain=StageConfig(2e-3, 256, 1), train=StageConfig(2e-3, 128, 1))

# "default" is what a run gets unless it asks for another schedule: the paper's for the paper's datasets.
# "paper-protocol": the paper's schedule under the readings of its protocol that reproduce its rows best
# (README "Comparison with the paper"); every method's own readings are in its `schedules` (methods/).
PAPER_PROTOCOL = dict(mechanism_rows="labeled")
for _presets in PRESETS.values():
    _presets.setdefault("default", _presets["paper"])
    _presets["paper-protocol"] = {**_presets["paper"], **PAPER_PROTOCOL}


def dataset_preset(dataset: str, preset: str) -> dict:
    """The settings of a dataset's preset (its widths and FALSE-VFL's schedule; `methods.make_config` puts a
    baseline's own schedule on top); an unknown dataset or preset is refused, listing the choices."""
    if dataset not in PRESETS:
        raise InputError(f"dataset {dataset!r} has no presets (config.PRESETS); give its settings explicitly")
    if preset not in PRESETS[dataset]:
        raise InputError(f"unknown preset {preset!r} for {dataset}; choose one of {sorted(PRESETS[dataset])}")
    return PRESETS[dataset][preset]


# `sized_schedule`: optimiser steps each stage aims at, and the bounds of its batch size and epochs.
AUTO_STEPS = {Stage.PRETRAIN: 3000, Stage.TRAIN: 1500}
AUTO_ROWS = {Stage.PRETRAIN: 1_200_000, Stage.TRAIN: 600_000}  # rows seen at most: large tables, fewer steps
AUTO_BATCH = {Stage.PRETRAIN: (256, 1024), Stage.TRAIN: (64, 512)}
AUTO_EPOCHS = {Stage.PRETRAIN: (3, 200), Stage.TRAIN: (3, 200)}


def _sized(stage: Stage, base: StageConfig, rows: int) -> StageConfig:
    """About AUTO_STEPS[stage] steps over `rows` rows, and at most AUTO_ROWS[stage] rows in all: batches of
    rows / 32 (a power of two in the stage's bounds: fewer, larger steps on large tables), as many epochs as
    the steps need, within bounds."""
    low, high = AUTO_BATCH[stage]
    batch = int(min(high, max(low, 2 ** round(math.log2(max(rows, 1) / 32)))))
    steps_per_epoch = max(1, math.ceil(rows / batch))
    least, most = AUTO_EPOCHS[stage]
    steps = min(AUTO_STEPS[stage], AUTO_ROWS[stage] / batch)
    epochs = int(min(most, max(least, round(steps / steps_per_epoch))))
    return replace(base, batch_size=batch, epochs=epochs)


def sized_schedule(cfg: Config, rows: int, labeled: int) -> Config:
    """With `auto_schedule`, the stages' batch sizes and epochs from the public counts every party knows after
    the alignment (records in the shared order, labeled records): each party derives the same schedule."""
    if not cfg.auto_schedule:
        return cfg
    return replace(cfg, pretrain=_sized(Stage.PRETRAIN, cfg.pretrain, rows),
                   train=_sized(Stage.TRAIN, cfg.train, labeled))
