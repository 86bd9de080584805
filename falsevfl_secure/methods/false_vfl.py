"""FALSE-VFL-I and -II (the paper's method) as a `Method`: one class, the variant a flag of the
configuration. Its steps are `false_vfl_steps.py`'s; its rounds are the `posterior` sum, the `latent` broadcast and
the `likelihood` sum, and in stage 1 their adjoints in reverse."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from ..config import Config, Stage
from ..errors import InputError
from ..model import ActiveModel, PartyModel, initialise
from ..model.active import balanced_weights
from ..model.active import own_width as model_own_width
from ..placement import Active
from ..privacy import noise_multiplier
from ..randomness import RoleRandomness
from ..transport.rounds import LATENT, LATENT_MOMENTS, LIKELIHOOD, POSTERIOR, Round, RoundTable
from .base import Method, Objective, Option, register
from .false_vfl_steps import predict, stage1_loss, stage2_loss


def _table(latent: Round) -> RoundTable:
    """Stage 1: the three forward rounds, then their adjoints in reverse; stage 2 and prediction: forward."""
    forward = (POSTERIOR, latent, LIKELIHOOD)
    backward = tuple(r.adjoint for r in reversed(forward))
    return RoundTable({Stage.PRETRAIN: (*forward, *backward), Stage.TRAIN: forward, Stage.PREDICT: forward})


ROUNDS = _table(LATENT)
MOMENTS_ROUNDS = _table(LATENT_MOMENTS)  # `latent_broadcast = "moments"` (measured, not the default)


@register
class FalseVfl(Method):
    """Stage 1: the IWAE bound over every generative parameter, on every row. Stage 2: the conditional bound
    over the discriminator only, on the labeled rows, the generative part frozen (no gradient leaves the
    active party). Prediction: SNIS over `predict_samples` latent samples."""

    name = "false-vfl"
    labels = {"false-vfl-i": {"variant": "I"}, "false-vfl-ii": {"variant": "II"}}
    options = {
        "variant": Option(("I", "II"), "FALSE-VFL-I (MAR) or -II (MNAR: it also models p(m | x))"),
        # The latent round: S draws of h per row, or (measured, not the default) mean, scale and a sampling key
        # per row: S/2 times fewer bytes, but every party learns the exact posterior (README "Why the broadcast
        # stays samples").
        "latent_broadcast": Option(("samples", "moments"), "the latent round sends samples or moments"),
        # p(y | h) (the paper), or p(y | h, x_active): the active party's own block too, or p(y | h, mu, x_active):
        # also the posterior mean mu it computes from the posterior sum; values it holds in clear, so nothing
        # more crosses (threat_models/labels.toml).
        "discriminator_inputs": Option(("latent", "latent+own", "latent+mean+own"), "the discriminator reads the "
                                       "latent samples, also the active party's own block, or also the posterior "
                                       "mean"),
        # With latent+own or latent+mean+own: also the active party's own trees' score of the record (fitted on its
        # own columns and labels; out of fold on its training rows). A federation only.
        "own_reference": Option((False, True), "the discriminator also reads the active party's own trees"),
        # Which own models score the record for own_reference: its trees, or its trees and its linear model
        # (which may suit a block of many numeric columns with few labels better than trees).
        "own_reference_models": Option(("hgb", "hgb+linear"), "with own_reference: the active party's own "
                                       "trees' score, or its trees' and its linear model's"),
        # "network+trees": after stage 2 the active party also fits gradient-boosted trees on the posterior mean
        # and its own block, blended with the discriminator by validation (model/trees.py); its own values.
        "head": Option(("network", "network+trees"), "the label model: the discriminator (the paper), or the "
                       "discriminator blended with the active party's trees on the posterior mean and its block"),
        # "skip": a party that does not hold a row adds nothing (the posterior over the holders, the paper's
        # Eq. (1)); "zeros": MIWAE's convention, the missing block encoded as zeros, every party in the posterior.
        # "once": the generative part is frozen in stage 2, so its rounds run once and every epoch trains the
        # discriminator on what they left (cached_stage.py): under DP two releases per row, not two per epoch.
        "stage2_pass": Option(("every_epoch", "once"), "stage 2 runs its rounds every epoch with new latent "
                              "samples (the paper), or once, every epoch training on that pass's samples"),
        "encode_missing": Option(("skip", "zeros"), "FALSE-VFL's posterior over the parties holding a row "
                                 "(skip) or all, missing blocks encoded as zeros (MIWAE's convention)"),
    }
    survives_party_loss = True  # a party adds only to sums; rows no one holds any more get weight 0 (steps)
    rounds = ROUNDS
    stackable = True
    selects_locally = True
    private = True

    @classmethod
    def configured(cls, cfg: Config) -> FalseVfl:
        method = (FalseVflMoments if cfg.options.get("latent_broadcast") == "moments" else cls)(cfg.options)
        # MIWAE's convention counts every party in each posterior, a party that left too: such a run stops
        method.survives_party_loss = method.settings["encode_missing"] == "skip"
        return method

    @classmethod
    def check_options(cls, options) -> None:
        if options["own_reference"] and options["discriminator_inputs"] == "latent":
            raise InputError("own_reference = true needs discriminator_inputs = \"latent+own\" or "
                             "\"latent+mean+own\" (the trees' score is an own input)")
        if options["own_reference_models"] != "hgb" and not options["own_reference"]:
            raise InputError(f"own_reference_models = \"{options['own_reference_models']}\" needs own_reference = true")

    def check(self, cfg: Config) -> None:
        if cfg.privacy.enabled and self.settings["latent_broadcast"] != "samples":
            raise InputError("privacy: latent_broadcast = \"moments\" is refused under a privacy budget (every "
                             "party would learn the exact posterior); use \"samples\"")
        # The unit is one party's block of a record, added or removed: a party that does not hold a row must add
        # nothing for it. FALSE-VFL-II's missingness term and MIWAE's zero blocks add a value there, so removing
        # a block swaps one clipped value for another (sensitivity 2C, not the C the accounting assumes).
        if cfg.privacy.enabled and (self.settings["variant"] == "II" or self.encodes_missing_blocks):
            raise InputError("privacy: FALSE-VFL-II and encode_missing = \"zeros\" are refused under a privacy "
                             "budget: a party adds a value for a row it does not hold, so removing its block "
                             "changes a release by up to twice the clip; use FALSE-VFL-I with encode_missing = "
                             "\"skip\"")

    @property
    def reads_own_reference(self) -> bool:
        return self.settings["own_reference"]

    @property
    def own_reference_kinds(self) -> tuple[str, ...]:
        """The active party's own models (reference.MODELS) whose scores its discriminator reads."""
        return tuple(self.settings["own_reference_models"].split("+")) if self.reads_own_reference else ()

    @property
    def reads_posterior_mean(self) -> bool:
        return self.settings["discriminator_inputs"] == "latent+mean+own"

    @property
    def fits_trees(self) -> bool:
        return self.settings["head"] == "network+trees"

    @property
    def caches_stage2(self) -> bool:
        return self.settings["stage2_pass"] == "once"

    @property
    def encodes_missing_blocks(self) -> bool:
        return self.settings["encode_missing"] == "zeros"

    def build_party(self, cfg: Config, width: int, randomness: RoleRandomness, layout=None) -> nn.Module:
        model = PartyModel(width, cfg.h_dim, cfg.party_hidden, self.settings["variant"], cfg.min_decoder_std,
                           cfg.indicator_hidden, cell_mask=cfg.cell_handling == "mask", layout=layout,
                           unit_precision=cfg.privacy.enabled)
        return initialise(model, randomness.stream("party/init"))

    def build_active(self, cfg: Config, n_classes: int, randomness: RoleRandomness, own_width: int = 0,
                     own_extra: int = 0) -> nn.Module:
        own = 0 if self.settings["discriminator_inputs"] == "latent" else model_own_width(own_width) + own_extra
        own += cfg.h_dim if self.reads_posterior_mean else 0
        model = ActiveModel(cfg.h_dim, cfg.z_dim, cfg.global_hidden, n_classes, cfg.discriminator_hidden, cfg.task,
                            own_inputs=own, **dp_posterior(cfg))
        return initialise(model, randomness.stream("active/init"))

    def prepare(self, node, data) -> None:
        """At the active party: the class weights of stage 2 from its labeled training rows (`class_weight`)."""
        if node.active.present and node.cfg.class_weight == "balanced" and node.cfg.task == "classification":
            node.active.get().class_weights = balanced_weights(data.y.get()[data.labeled_index],
                                                               node.active.get().model.n_classes)

    def loss(self, node, batch, stage: Stage) -> Objective:
        return Objective(stage1_loss(node, batch) if stage is Stage.PRETRAIN else stage2_loss(node, batch))

    def predict(self, node, batch) -> Active[Tensor]:
        return predict(node, batch)

    def parameters(self, node, stage: Stage) -> dict[str, Iterable[nn.Parameter]]:
        """Stage 1 trains every generative parameter; stage 2 the discriminator only."""
        if stage is Stage.TRAIN:
            return {"discriminator": node.active.get().model.discriminator.parameters()} if node.active.present else {}
        groups: dict[str, Iterable[nn.Parameter]] = {f"party{k}": r.model.parameters() for k, r in node.parties.items()}
        if node.active.present:
            groups["active"] = node.active.get().model.generative_parameters()
        return groups


def dp_posterior(cfg: Config) -> dict:
    """Under DP, how the active party reads the noised posterior sum: unit precisions, the means shrunk by the
    noise every party adds (n sigma^2 / (n - 1 - t) per value) against a holder's clipped mean (C^2 / d_h)."""
    privacy = cfg.privacy
    if not privacy.enabled:
        return {}
    sigma = noise_multiplier(cfg) * privacy.clip_posterior
    noise = cfg.parties * sigma**2 / (cfg.parties - 1 - privacy.collusion)
    return {"unit_precision": True, "noise_var": noise, "signal_var": privacy.clip_posterior**2 / cfg.h_dim}


class FalseVflMoments(FalseVfl):
    """FALSE-VFL whose latent round broadcasts the posterior's mean and scale and a sampling key per row
    (`latent_moments`); every party draws the S samples itself. The same model and loss; S/2 times fewer
    bytes in that round, but every party learns the exact posterior (measured: README)."""

    rounds = MOMENTS_ROUNDS


FalseVfl.variants = (FalseVflMoments,)
