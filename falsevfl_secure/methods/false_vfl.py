"""FALSE-VFL-I and -II (the paper's method) as a `Method`: one class, the variant a flag of the
configuration. Its steps are `steps.py`'s; its rounds are the `posterior` sum, the `latent` broadcast and
the `likelihood` sum, and in stage 1 their adjoints in reverse."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from ..config import Config, Stage
from ..model import ActiveModel, PartyModel, initialise
from ..placement import Active
from ..randomness import RoleRandomness
from ..steps import predict, stage1_loss, stage2_loss
from ..transport.rounds import LATENT, LATENT_GRAD, LIKELIHOOD, LIKELIHOOD_GRAD, POSTERIOR, POSTERIOR_GRAD, RoundTable
from .base import Method, Objective

FORWARD = (POSTERIOR, LATENT, LIKELIHOOD)
ROUNDS = RoundTable({Stage.PRETRAIN: (*FORWARD, LIKELIHOOD_GRAD, LATENT_GRAD, POSTERIOR_GRAD),
                     Stage.TRAIN: FORWARD, Stage.PREDICT: FORWARD})


class FalseVfl(Method):
    """Stage 1: the IWAE bound over every generative parameter, on every row. Stage 2: the conditional bound
    over the discriminator only, on the labeled rows, the generative part frozen (no gradient leaves the
    active party). Prediction: SNIS over `predict_samples` latent samples."""

    name = "false-vfl"
    rounds = ROUNDS
    stackable = True

    def build_party(self, cfg: Config, width: int, randomness: RoleRandomness) -> nn.Module:
        model = PartyModel(width, cfg.h_dim, cfg.party_hidden, cfg.variant, cfg.min_decoder_std, cfg.indicator_hidden,
                           cell_mask=cfg.cell_handling == "mask")
        return initialise(model, randomness.stream("party/init"))

    def build_active(self, cfg: Config, n_classes: int, randomness: RoleRandomness) -> nn.Module:
        model = ActiveModel(cfg.h_dim, cfg.z_dim, cfg.global_hidden, n_classes, cfg.discriminator_hidden, cfg.task)
        return initialise(model, randomness.stream("active/init"))

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
