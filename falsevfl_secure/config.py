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

from .data.loaders import DEFAULT_LABELED, STANDARDIZE, TABULAR_DEFAULT, canonical_name
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
LATENT_BROADCAST = ("samples", "moments")  # what FALSE-VFL's latent round sends (Config.latent_broadcast)

# Settings that do not change what training computes: a checkpoint may be resumed with others.
NOT_TRAINING_SETTINGS = frozenset({"device", "eval_batch_size", "stack_parties"})


DISCRIMINATOR_INPUTS = ("latent", "latent+own")  # Config.discriminator_inputs: p(y | h) or p(y | h, x_active)
CLASS_WEIGHTS = ("none", "balanced")  # Config.class_weight: stage 2's weight of each labeled row
IMPUTE = ("embedding", "features")  # Config.impute: a missing party's stand-in in a baseline's fusion
LASER_BATCHES = ("grouped", "grouped-full", "plain")  # Config.laser_batches: how LASER-VFL forms its batches
PLUG_DROPS = ("row", "batch")  # Config.plug_drop: what PlugVFL's party dropout drops
ENCODE_MISSING = ("skip", "zeros")  # Config.encode_missing: FALSE-VFL's posterior over held parties, or MIWAE's
OPTIMIZERS = ("adam", "sgd")  # sgd: momentum 0.9, as SimSiam's pretraining uses it
# The methods, by the names `simulate --method`, `bench/accuracy.py --methods` and `[model] method` take:
# FALSE-VFL-I and -II are one method with a flag (`Config.variant`); the baselines of the paper's App. D.1.
METHOD_LABELS: dict[str, tuple[str, str]] = {
    "false-vfl-i": ("false-vfl", "I"), "false-vfl-ii": ("false-vfl", "II"), "vanilla": ("vanilla", "I"),
    "laser": ("laser", "I"), "plugvfl": ("plugvfl", "I"), "fedhssl": ("fedhssl", "I")}
METHODS = tuple(dict.fromkeys(method for method, _ in METHOD_LABELS.values()))


def parse_method(label: str) -> tuple[str, str]:
    """(method, variant) of a method's name; an unknown name is refused, listing the valid ones."""
    if label not in METHOD_LABELS:
        raise InputError(f"unknown method {label!r}; choose one of {', '.join(METHOD_LABELS)}")
    return METHOD_LABELS[label]


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
        _need(self.epochs >= 0, f"{name} epochs={self.epochs}: must be >= 0")
        _need(self.batch_size >= 1, f"{name} batch_size={self.batch_size}: must be >= 1")
        _need(self.lr > 0 and self.weight_decay >= 0,
              f"{name}: lr must be > 0 and weight_decay >= 0 (got {self.lr}, {self.weight_decay})")
        _need(self.optimizer in OPTIMIZERS, f"{name} optimizer={self.optimizer!r}: choose adam or sgd")
        _need(isinstance(self.steps_per_epoch, int) and self.steps_per_epoch >= 0,
              f"{name} steps_per_epoch={self.steps_per_epoch}: an integer >= 0 (0: every batch of the epoch)")


PRIVACY_BUDGET = ("epsilon", "delta", "max_releases_per_row")  # each party's own, never agreed


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
    # log-densities centred over the samples, the latent gradient's two moments (`privacy.propose_clips`).
    # Defaults: per-row norms measured on digits (h_dim 32: medians after 10 epochs; the gradient between its
    # median at the start, 18, and after 10 epochs, 131; README "Output privacy").
    clip_posterior: float = 6.0
    clip_likelihood: float = 32.0
    clip_latent_grad: float = 0.04
    clip_gradient: float = 30.0  # DP-SGD: each row's gradient over a party's own parameters
    max_releases_per_row: int = 0  # 0: no cap besides epsilon

    @property
    def enabled(self) -> bool:
        return self.epsilon > 0

    @property
    def clips(self) -> dict[str, float]:
        """The clip norm of each summed round, by the round's name."""
        return {"posterior": self.clip_posterior, "likelihood": self.clip_likelihood,
                "latent_grad": self.clip_latent_grad}

    def check(self, parties: int) -> None:
        _need(math.isfinite(self.epsilon) and self.epsilon >= 0, f"privacy epsilon={self.epsilon}: >= 0 (0: off)")
        _need(0 < self.delta < 1, f"privacy delta={self.delta}: in (0, 1)")
        _need(self.noise_multiplier >= 0, f"privacy noise_multiplier={self.noise_multiplier}: >= 0 (0: calibrated)")
        _need(isinstance(self.collusion, int) and 0 <= self.collusion <= parties - 2,
              f"privacy collusion={self.collusion}: an integer in 0..{parties - 2} (the noise of at least one "
              "party besides the active one must remain)")
        for name in ("clip_posterior", "clip_likelihood", "clip_latent_grad", "clip_gradient"):
            _need(getattr(self, name) > 0, f"privacy {name}={getattr(self, name)}: must be positive")
        _need(isinstance(self.max_releases_per_row, int) and self.max_releases_per_row >= 0,
              f"privacy max_releases_per_row={self.max_releases_per_row}: an integer >= 0")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise InputError(message)


@dataclass(frozen=True)
class Config:
    dataset: str = "digits"
    parties: int = 4
    active_party: int = -1  # -1: the last party
    method: str = "false-vfl"  # one of METHODS: FALSE-VFL or a baseline of the paper (methods/)
    # Vanilla VFL, PlugVFL, FedHSSL: what stands in for a party that does not hold a row in the fusion,
    # "embedding" (zeros in place of its embedding; LASER-VFL's implementation of PlugVFL) or "features"
    # (its extractor's embedding of zeros, the mean of standardised features: zero imputation of the data).
    impute: str = "embedding"
    variant: str = "I"  # FALSE-VFL's "I" (MAR) or "II" (MNAR: models p(m | x)); "I" for every baseline
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
    # FALSE-VFL's latent broadcast: "samples" (S draws of h per row, the default) or "moments" (mean,
    # scale and a sampling key per row: S/2 times fewer bytes, but every party learns the exact posterior,
    # which measurably discloses more; README "Why the broadcast stays samples").
    latent_broadcast: str = "samples"
    # FALSE-VFL's discriminator: "latent" reads the latent samples only, p(y | h) (the paper); "latent+own"
    # also the active party's own block where it holds the record, p(y | h, x_active): values it holds in
    # clear, so nothing more crosses (threat_models/labels.toml).
    discriminator_inputs: str = "latent"
    # With "latent+own": the discriminator also reads the active party's own gradient-boosted trees' score of
    # the record (fitted on its own columns and labels; out of fold on its training rows): stage 2 then learns
    # what the other parties add to the best model the active party has alone. A federation only.
    own_reference: bool = False
    # Readings of the paper's protocol (README "Comparison with the paper"); the defaults are this project's.
    # LASER-VFL's stage-2 batches: "grouped" (the rows of one observed set, every group cut into batches of at
    # most batch_size: the paper's "mini-batches that share a single mask"), "grouped-full" (the same, only
    # full batches: the rest of each group waits for a later epoch's shuffle), "plain" (shuffled batches,
    # each row its own set of parties, as every other method).
    laser_batches: str = "grouped"
    # PlugVFL's dropout of a passive party with probability 0.5: per "row" (each row its own draw) or per
    # "batch" (one draw per party and mini-batch, as the LASER-VFL code's PlugVFL the paper adopts does).
    plug_drop: str = "row"
    # Simulations: the training mechanism removes blocks from "all" training rows outside the aligned reserve,
    # or from the "labeled" ones only (the paper: "we reserve 100 ... of the labeled samples as fully aligned
    # and render the remainder partially aligned"); the unlabeled rows then stay fully observed.
    mechanism_rows: str = "all"
    # FALSE-VFL's encoder input for a party that does not hold a row: "skip" (it adds nothing: the posterior is
    # over the parties that hold the row, the paper's Eq. (1)) or "zeros" (MIWAE's convention: the missing
    # block encoded as zeros, every party in the posterior; the likelihood still covers held blocks only).
    encode_missing: str = "skip"
    class_weight: str = "none"  # stage 2: "balanced" weighs each labeled row by n / (C n_class) (classification)
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
    def label(self) -> str:
        """The method's name as `--method` takes it (false-vfl-i, false-vfl-ii, vanilla, ...)."""
        return f"false-vfl-{self.variant.lower()}" if self.method == "false-vfl" else self.method

    @property
    def active_index(self) -> int:
        """The active party's index (the `active_party` setting may count from the end)."""
        return self.active_party % self.parties

    def schedule(self, stage: Stage) -> StageConfig:
        """The optimiser settings and epochs of a training stage."""
        return {Stage.PRETRAIN: self.pretrain, Stage.TRAIN: self.train}[stage]

    def to_dict(self) -> dict:
        return asdict(self)

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
        _need(isinstance(self.seed, int) and 0 <= self.seed < 2**32, f"seed={self.seed}: must be in 0..2^32-1")
        _need(self.max_rows is None or (isinstance(self.max_rows, int) and self.max_rows >= 10),
              f"max_rows={self.max_rows}: must be at least 10 (or unset)")
        for name in ("h_dim", "z_dim", "party_hidden", "global_hidden", "discriminator_hidden", "indicator_hidden",
                     "kappa", "predict_samples", "eval_batch_size"):
            value = getattr(self, name)
            _need(isinstance(value, int) and value >= 1, f"{name}={value}: must be a positive integer")
        _need(self.min_decoder_std > 0, f"min_decoder_std={self.min_decoder_std}: must be positive")
        for stage_name in ("pretrain", "train"):
            getattr(self, stage_name).check(stage_name)
        self.privacy.check(self.parties)
        _need(not self.privacy.enabled or (self.method == "false-vfl" and self.latent_broadcast == "samples"),
              f"privacy: method {self.label!r} is refused under a privacy budget: its summed rounds carry "
              "label-dependent gradients back to the parties (embedding_grad, subsets_grad) that no budget covers "
              "yet; run false-vfl-i or false-vfl-ii (latent_broadcast = \"samples\")")
        parse_mechanism(self.train_mechanism)
        return self

    def _check_choices(self) -> None:
        """The settings that name one of a few choices, and the pairs of them that do not combine."""
        _need(self.method in METHODS, f"method={self.method!r}: choose one of {', '.join(METHODS)}")
        _need(self.variant in ("I", "II"), f"variant={self.variant!r}: choose I or II")
        _need(self.impute in IMPUTE, f"impute={self.impute!r}: choose {' or '.join(IMPUTE)}")
        _need(self.impute == "embedding" or self.method in ("vanilla", "plugvfl", "fedhssl"),
              f"impute={self.impute!r} is for vanilla, plugvfl and fedhssl only, not {self.method!r}")
        _need(self.method == "false-vfl" or self.variant == "I",
              f"variant={self.variant!r} is FALSE-VFL's; method {self.method!r} has none (leave it I)")
        _need(self.stack_parties in ("auto", "always", "never"),
              f"stack_parties={self.stack_parties!r}: choose auto, always or never")
        _need(self.task in ("classification", "regression"), f"task={self.task!r}: classification or regression")
        _need(self.cell_handling in CELL_HANDLING, f"cell_handling={self.cell_handling!r}: choose mask or mean")
        _need(self.latent_broadcast in LATENT_BROADCAST and (self.method == "false-vfl"
                                                              or self.latent_broadcast == "samples"),
              f"latent_broadcast={self.latent_broadcast!r}: choose samples or moments (FALSE-VFL only)")
        _need(self.discriminator_inputs in DISCRIMINATOR_INPUTS and (self.method == "false-vfl"
                                                                      or self.discriminator_inputs == "latent"),
              f"discriminator_inputs={self.discriminator_inputs!r}: choose latent or latent+own (FALSE-VFL only)")
        _need(not self.own_reference or self.discriminator_inputs == "latent+own",
              "own_reference = true needs discriminator_inputs = \"latent+own\" (the trees' score is an own input)")
        for name, choices, owner in (("laser_batches", LASER_BATCHES, "laser"), ("plug_drop", PLUG_DROPS, "plugvfl"),
                                     ("encode_missing", ENCODE_MISSING, "false-vfl")):
            value = getattr(self, name)
            _need(value in choices, f"{name}={value!r}: choose {' or '.join(choices)}")
            _need(value == choices[0] or self.method == owner,
                  f"{name}={value!r} is {owner}'s option, not {self.method}'s")
        _need(self.mechanism_rows in MECHANISM_ROWS,
              f"mechanism_rows={self.mechanism_rows!r}: choose {' or '.join(MECHANISM_ROWS)}")
        _need(self.class_weight in CLASS_WEIGHTS, f"class_weight={self.class_weight!r}: choose none or balanced")
        _need(self.standardize in STANDARDIZE, f"standardize={self.standardize!r}: choose {', '.join(STANDARDIZE)}")


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
# columns in the discriminator, the schedule sized by the table (`sized_schedule`).
PRESETS["digits"]["auto"] = dict(PRESETS["digits"]["paper"], auto_schedule=True, discriminator_inputs="latent+own",
                                 own_reference=True,
                                 pretrain=StageConfig(2e-3, 256, 1), train=StageConfig(2e-3, 128, 1))

# "default" is what a run gets unless it asks for another schedule: the paper's for the paper's datasets.
# "paper-protocol": the paper's schedule under the readings of its protocol that reproduce its rows best
# (README "Comparison with the paper"); every method's own readings are in METHOD_SCHEDULES.
PAPER_PROTOCOL = dict(mechanism_rows="labeled")
for _presets in PRESETS.values():
    _presets.setdefault("default", _presets["paper"])
    _presets["paper-protocol"] = {**_presets["paper"], **PAPER_PROTOCOL}


def _sgd(lr: float, batch: int, epochs: int, weight_decay: float = 3e-5) -> StageConfig:
    return StageConfig(lr, batch, epochs, weight_decay, "sgd")


def _baseline(pretrain: StageConfig, train: StageConfig, **protocol) -> dict:
    """A baseline's schedule: SimSiam pretraining of the local models, then fine-tuning with labels; under
    `paper-protocol` with the method's own readings (`protocol`)."""
    quick = dict(pretrain=replace(pretrain, epochs=max(1, pretrain.epochs // 10)),
                 train=replace(train, epochs=max(1, train.epochs // 10)))
    paper = dict(pretrain=pretrain, train=train)
    return {"paper": paper, "quick": quick, "paper-protocol": {**paper, **protocol}}


def _laser(dataset: str, pretrain: StageConfig, train: StageConfig) -> dict:
    """LASER-VFL under `paper-protocol`: stage 2 at the step count the paper's table states, epochs x
    ceil(labeled rows / batch size) (its grouped batches are many more and mostly tiny: README)."""
    labeled = DEFAULT_LABELED.get(dataset, TABULAR_DEFAULT)[0]
    schedule = _baseline(pretrain, train)
    schedule["paper-protocol"]["train"] = replace(train, steps_per_epoch=math.ceil(labeled / train.batch_size))
    return schedule


def _plug(pretrain: StageConfig, train: StageConfig) -> dict:
    """PlugVFL under `paper-protocol`: a passive party dropped per mini-batch (the LASER-VFL code's PlugVFL)."""
    return _baseline(pretrain, train, plug_drop="batch")


# The baselines' schedules (paper, App. D.1, Tables "Hyperparameters for ..."; the SimSiam pretraining in
# the paper's parentheses). Widths follow the dataset's preset: the embedding is h_dim wide (128 on Isolet
# and HAPT, as the paper's latent dimension), the extractors party_hidden. Digits has no paper setting:
# the same shape of schedule, shorter.
METHOD_SCHEDULES: dict[str, dict[str, dict[str, dict]]] = {
    "vanilla": {"isolet": _baseline(_sgd(0.025, 512, 100), StageConfig(5e-4, 32, 500)),
                "hapt": _baseline(_sgd(0.02, 512, 150), StageConfig(5e-3, 64, 100)),
                "fashion-mnist": _baseline(_sgd(0.02, 1024, 100), StageConfig(1e-4, 128, 150)),
                "digits": _baseline(_sgd(0.025, 128, 40), StageConfig(1e-3, 32, 100))},
    "laser": {"isolet": _laser("isolet", _sgd(0.025, 512, 100), StageConfig(5e-5, 64, 200)),
              "hapt": _laser("hapt", _sgd(0.02, 512, 150), StageConfig(1e-3, 128, 100)),
              "fashion-mnist": _laser("fashion-mnist", _sgd(0.02, 1024, 100), StageConfig(1e-4, 128, 100)),
              "digits": _laser("digits", _sgd(0.025, 128, 40), StageConfig(1e-3, 32, 60))},
    "plugvfl": {"isolet": _plug(_sgd(0.025, 512, 100), StageConfig(5e-5, 32, 100)),
                "hapt": _plug(_sgd(0.02, 512, 150), StageConfig(5e-4, 64, 100)),
                "fashion-mnist": _plug(_sgd(0.02, 1024, 100), StageConfig(1e-4, 128, 150)),
                "digits": _plug(_sgd(0.025, 128, 40), StageConfig(1e-3, 32, 60))},
    "fedhssl": {"isolet": _baseline(_sgd(0.025, 512, 150), StageConfig(2e-3, 64, 300)),
                "hapt": _baseline(StageConfig(0.025, 512, 100, 1e-5), StageConfig(5e-4, 64, 500)),
                "fashion-mnist": _baseline(_sgd(0.02, 1024, 150), StageConfig(1e-4, 128, 100)),
                "digits": _baseline(_sgd(0.025, 128, 40), StageConfig(1e-3, 32, 100))},
}
for _schedules in METHOD_SCHEDULES.values():
    for _per_dataset in _schedules.values():
        _per_dataset.setdefault("default", _per_dataset["paper"])


def make_config(dataset: str = "digits", preset: str = "quick", **overrides) -> Config:
    """The preset for `dataset` (a baseline's schedule on top of the dataset's widths when `method` names
    one), with explicit overrides (None values are ignored)."""
    key = canonical_name(dataset)
    if key not in PRESETS:
        raise InputError(f"dataset {key!r} has no presets (config.PRESETS); give its settings explicitly")
    if preset not in PRESETS[key]:
        raise InputError(f"unknown preset {preset!r} for {key}; choose one of {sorted(PRESETS[key])}")
    given = {k: v for k, v in overrides.items() if v is not None}
    schedule = _method_schedule(given.get("method", "false-vfl"), key, preset)
    values = {**PRESETS[key][preset], **schedule, **given}
    if values.get("method", "false-vfl") != "false-vfl" and "discriminator_inputs" not in given:
        values["discriminator_inputs"] = "latent"  # the preset's choice is FALSE-VFL's; a baseline has its own head
        values["own_reference"] = False
    return replace(Config(dataset=key), **values).validate()


def _method_schedule(method: str, dataset: str, preset: str) -> dict:
    """A baseline's own schedule for the preset (FALSE-VFL's are the presets themselves); a method without
    one is an input error, never FALSE-VFL's schedule in its place. `auto` takes its default (sized later)."""
    if method == "false-vfl" or method not in METHOD_SCHEDULES:
        return {}  # an unknown method is refused by Config.validate, naming the choices
    schedules = METHOD_SCHEDULES[method].get(dataset)
    wanted = "default" if preset == "auto" else preset
    if schedules is None or wanted not in schedules:
        have = sorted(METHOD_SCHEDULES[method].get(dataset, {})) or "none"
        raise InputError(f"method {method!r} has no {preset!r} schedule for {dataset} (it has: {have}); give its "
                         "schedule explicitly or choose another preset")
    return schedules[wanted]


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
