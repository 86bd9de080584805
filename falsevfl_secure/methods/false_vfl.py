"""FALSE-VFL-I and -II (the paper's method) as a `Method`: one class, the variant a flag of the
configuration. Its steps are `steps.py`'s; its rounds are the `posterior` sum, the `latent` broadcast and
the `likelihood` sum, and in stage 1 their adjoints in reverse."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from ..config import Config, Stage
from ..model import ActiveModel, PartyModel, initialise
from ..model.active import balanced_weights
from ..model.active import own_width as model_own_width
from ..placement import Active
from ..privacy import noise_multiplier
from ..randomness import RoleRandomness
from ..steps import predict, stage1_loss, stage2_loss
from ..transport.rounds import LATENT, LATENT_MOMENTS, LIKELIHOOD, POSTERIOR, Round, RoundTable
from .base import Method, Objective


def _table(latent: Round) -> RoundTable:
    """Stage 1: the three forward rounds, then their adjoints in reverse; stage 2 and prediction: forward."""
    forward = (POSTERIOR, latent, LIKELIHOOD)
    backward = tuple(r.adjoint for r in reversed(forward))
    return RoundTable({Stage.PRETRAIN: (*forward, *backward), Stage.TRAIN: forward, Stage.PREDICT: forward})


ROUNDS = _table(LATENT)
MOMENTS_ROUNDS = _table(LATENT_MOMENTS)  # `latent_broadcast = "moments"` (measured, not the default)


class FalseVfl(Method):
    """Stage 1: the IWAE bound over every generative parameter, on every row. Stage 2: the conditional bound
    over the discriminator only, on the labeled rows, the generative part frozen (no gradient leaves the
    active party). Prediction: SNIS over `predict_samples` latent samples."""

    name = "false-vfl"
    survives_party_loss = True  # a party adds only to sums; rows no one holds any more get weight 0 (steps)
    rounds = ROUNDS
    stackable = True
    selects_locally = True

    @classmethod
    def configured(cls, cfg: Config) -> FalseVfl:
        method = FalseVflMoments() if cfg.latent_broadcast == "moments" else cls()
        # MIWAE's convention counts every party in each posterior, a party that left too: such a run stops
        method.survives_party_loss = cfg.encode_missing == "skip"
        return method

    def build_party(self, cfg: Config, width: int, randomness: RoleRandomness, layout=None) -> nn.Module:
        model = PartyModel(width, cfg.h_dim, cfg.party_hidden, cfg.variant, cfg.min_decoder_std, cfg.indicator_hidden,
                           cell_mask=cfg.cell_handling == "mask", layout=layout, unit_precision=cfg.privacy.enabled)
        return initialise(model, randomness.stream("party/init"))

    def build_active(self, cfg: Config, n_classes: int, randomness: RoleRandomness, own_width: int = 0,
                     own_extra: int = 0) -> nn.Module:
        own = model_own_width(own_width) + own_extra if cfg.discriminator_inputs == "latent+own" else 0
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
