"""What the baselines share (paper, App. D.1): a party extractor pretrained by SimSiam on the party's own
rows (stage 1: local, nothing crosses a party boundary), then fine-tuned with labels together with the
active party's fusion model on the fused embedding (stage 2).

The fusion is one `embedding` sum: each party contributes its embedding of the rows it holds and exact
zeros elsewhere (the paper's zero imputation of a missing party), the active party divides the sum by K
(the mean over all K parties, zeros included) and scores it; the adjoint broadcast carries the loss's
gradient w.r.t. the sum back to every party. Unlike FALSE-VFL's stage 2, that gradient depends on the
labels: the baselines fine-tune every extractor with them (protocols/*.toml says what each party learns).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch
from torch import Tensor, nn

from ..config import Config, Stage, StageConfig
from ..model import initialise
from ..model.embedding import EmbeddingParty, FusionHead
from ..model.ssl import augment, feature_range
from ..placement import Active, apply
from ..randomness import RoleRandomness
from ..transport.rounds import EMBEDDING, EMBEDDING_GRAD, RoundTable
from .base import Method, Objective, Option

AUGMENT_STREAM = "party/ssl/augment"  # a party's secret stream of augmentation draws


def sgd(lr: float, batch: int, epochs: int, weight_decay: float = 3e-5) -> StageConfig:
    """SGD with momentum 0.9, as SimSiam's pretraining uses it."""
    return StageConfig(lr, batch, epochs, weight_decay, "sgd")


def baseline_schedule(pretrain: StageConfig, train: StageConfig, **protocol) -> dict:
    """A baseline's schedule: SimSiam pretraining of the local models, then fine-tuning with labels (paper, App.
    D.1, Tables "Hyperparameters for ..."; the SimSiam pretraining in the paper's parentheses); `quick` a tenth
    of the epochs; under `paper-protocol` with the method's own readings (`protocol`). Widths follow the
    dataset's preset: the embedding is h_dim wide, the extractors party_hidden. Digits has no paper setting: the
    same shape of schedule, shorter."""
    quick = dict(pretrain=replace(pretrain, epochs=max(1, pretrain.epochs // 10)),
                 train=replace(train, epochs=max(1, train.epochs // 10)))
    paper = dict(pretrain=pretrain, train=train)
    return {"paper": paper, "quick": quick, "paper-protocol": {**paper, **protocol}}


class EmbeddingFusion(Method):
    """The two-stage baseline with mean fusion of the K parties' embeddings (Vanilla VFL's model).
    Subclasses change which rows train (`rows`), what a party contributes (`contribution`) or the fusion."""

    rounds = RoundTable({Stage.TRAIN: (EMBEDDING, EMBEDDING_GRAD), Stage.PREDICT: (EMBEDDING,)})
    probe_stages = (Stage.TRAIN,)
    # What stands in for a party that does not hold a row: "embedding" (zeros in place of its embedding;
    # LASER-VFL's implementation of PlugVFL) or "features" (its extractor's embedding of zeros, the mean of
    # standardised features: zero imputation of the data)
    options = {"impute": Option(("embedding", "features"), "a missing party's stand-in in the fusion: zeros for "
                                "its embedding, or its embedding of zero (mean) features")}

    def party_module(self, cfg: Config, width: int) -> nn.Module:
        return EmbeddingParty(width, cfg.h_dim, cfg.party_hidden)

    def embedding_width(self, cfg: Config) -> int:
        """The width of a party's embedding (what the fusion sums)."""
        return cfg.h_dim

    def wire_sizes(self, cfg: Config, rows: int = 0) -> dict[str, int]:
        return {**super().wire_sizes(cfg, rows), "E": self.embedding_width(cfg)}

    def build_party(self, cfg: Config, width: int, randomness: RoleRandomness, layout=None) -> nn.Module:
        return initialise(self.party_module(cfg, width), randomness.stream("party/init"))

    def build_active(self, cfg: Config, n_classes: int, randomness: RoleRandomness, own_width: int = 0,
                     own_extra: int = 0) -> nn.Module:
        return initialise(FusionHead(self.embedding_width(cfg), cfg.discriminator_hidden, n_classes, cfg.task),
                          randomness.stream("active/init"))

    def prepare(self, node, data) -> None:
        """Each party's feature range over its own training rows (the augmentation draws from it)."""
        for k, role in node.parties.items():
            role.model.set_range(*feature_range(data.x[k], data.held[k]))

    # -- stage 1: SimSiam on each party's own rows ---------------------------------------------------------

    def ssl_loss(self, role, batch, k: int) -> Tensor:
        """Party k's SimSiam loss on the rows of the batch it holds (two augmented views each)."""
        x = batch.x[k][batch.held[k]]
        if x.shape[0] < 2:  # nothing to augment; simsiam_loss takes no step on fewer than ssl.MIN_ROWS rows
            return x.new_zeros(())
        stream, model = role.randomness.stream(AUGMENT_STREAM), role.model
        return model.ssl_loss(augment(x, model.low, model.high, stream), augment(x, model.low, model.high, stream))

    def local_losses(self, node, batch) -> dict[int, Tensor]:
        return {k: self.ssl_loss(role, batch, k) for k, role in node.parties.items()}

    # -- stage 2 and prediction: the fused embedding -------------------------------------------------------

    def contribution(self, node, batch, k: int, training: bool) -> Tensor:
        """Party k's addend to the fusion: its embedding of the rows it holds; elsewhere exact zeros, or
        with `impute = "features"` its embedding of the zeros its block holds there (the features' mean)."""
        embedding = node.parties[k].model.embed(batch.x[k])
        if self.settings.get("impute") == "features":  # (LASER-VFL has no such option: zeros)
            return embedding
        return torch.where(batch.held[k].unsqueeze(-1), embedding, torch.zeros_like(embedding))

    def fuse(self, node, batch, training: bool) -> Active[Tensor]:
        """The mean of the K parties' addends (one `embedding` sum), at the active party."""
        addends = {k: self.contribution(node, batch, k, training) for k in node.parties}
        return node.transport.aggregate(EMBEDDING, addends).map(lambda total: total / node.cfg.parties)

    def loss(self, node, batch, stage: Stage) -> Objective:
        if stage is Stage.PRETRAIN:
            return Objective(node.active.map(lambda _: torch.zeros((), device=node.device)),
                             self.local_losses(node, batch))
        fused = self.fuse(node, batch, training=True)
        return Objective(apply(lambda role, f, y: -role.model.log_prob(f, y).mean(), node.active, fused, batch.y))

    @torch.no_grad()
    def predict(self, node, batch) -> Active[Tensor]:
        return apply(lambda role, f: role.model.predict(f), node.active, self.fuse(node, batch, training=False))

    def parameters(self, node, stage: Stage) -> dict[str, Iterable[nn.Parameter]]:
        """Stage 1: each party's extractor and SimSiam heads; stage 2: the extractors and the fusion model."""
        if stage is Stage.PRETRAIN:
            return {f"party{k}": role.model.parameters() for k, role in node.parties.items()}
        groups: dict[str, Iterable[nn.Parameter]] = {f"party{k}": self.fine_tuned(role.model)
                                                     for k, role in node.parties.items()}
        if node.active.present:
            groups["active"] = node.active.get().model.parameters()
        return groups

    def fine_tuned(self, model: nn.Module) -> list[nn.Parameter]:
        """The party parameters fine-tuning trains: the extractor (not the SimSiam heads)."""
        return list(model.extractor.parameters())
