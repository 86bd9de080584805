"""FedHSSL (He et al., 2024) with SimSiam (paper, App. D.1).

Stage 1, every row: local SimSiam of each party's local encoder (bottom and top) on the rows it holds,
plus cross-party SimSiam of each party's cross-party encoder on the rows every party holds (the aligned
rows): a party's view of a row is its own block, and its target the mean of the other parties'
projections of the row. The projections travel as one `cross_view` sum; the active party broadcasts the
sum back (`cross_target`), and each party subtracts its own and divides by K - 1, so a party learns the
sum of the others' projections of the aligned rows, never one party's. The targets carry no gradient
(SimSiam's stop-gradient), so these rounds have no adjoint. At the end of every epoch, the partial model
aggregation: the local top encoders and local SimSiam heads are averaged across parties as a secure sum
(`model_sum`) whose mean the active party broadcasts back (`model_mean`).

Stage 2: fine-tuning on the labeled rows every party holds, each party's embedding its cross-party and
local encoders' outputs side by side; at test zeros for a party that does not hold the row."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector

from ..config import Config, Stage, StageConfig
from ..model.embedding import HybridParty
from ..model.ssl import MIN_ROWS, negative_cosine
from ..transport.rounds import CROSS_TARGET, CROSS_VIEW, EMBEDDING, EMBEDDING_GRAD, MODEL_MEAN, MODEL_SUM, RoundTable
from .base import Objective, patterns_of, register
from .fusion import EmbeddingFusion, baseline_schedule, sgd


@register
class FedHssl(EmbeddingFusion):
    name = "fedhssl"
    schedules = {"isolet": baseline_schedule(sgd(0.025, 512, 150), StageConfig(2e-3, 64, 300)),
                 "hapt": baseline_schedule(StageConfig(0.025, 512, 100, 1e-5), StageConfig(5e-4, 64, 500)),
                 "fashion-mnist": baseline_schedule(sgd(0.02, 1024, 150), StageConfig(1e-4, 128, 100)),
                 "digits": baseline_schedule(sgd(0.025, 128, 40), StageConfig(1e-3, 32, 100))}
    needs_patterns = True
    row_rule = {Stage.PRETRAIN: "every row", Stage.TRAIN: "the labeled rows every party holds"}
    rounds = RoundTable({Stage.PRETRAIN: (CROSS_VIEW, CROSS_TARGET), Stage.TRAIN: (EMBEDDING, EMBEDDING_GRAD),
                         Stage.PREDICT: (EMBEDDING,)}, epoch_end={Stage.PRETRAIN: (MODEL_SUM, MODEL_MEAN)})
    probe_stages = (Stage.PRETRAIN, Stage.TRAIN)

    def party_module(self, cfg: Config, width: int) -> nn.Module:
        return HybridParty(width, cfg.h_dim, cfg.party_hidden)

    def embedding_width(self, cfg: Config) -> int:
        return 2 * cfg.h_dim  # the cross-party and the local encoder's outputs side by side

    def wire_sizes(self, cfg: Config, rows: int = 0) -> dict[str, int]:
        with torch.device("meta"):  # shapes only: no initialisation, no draw from any generator
            shared = self.party_module(cfg, 1).shared()  # the averaged parameters do not depend on a block's width
        return {**super().wire_sizes(cfg, rows), "P": sum(p.numel() for p in shared)}

    def rows(self, stage: Stage, data) -> np.ndarray:
        patterns = patterns_of(data, self.name)
        if stage is Stage.PRETRAIN:
            return np.arange(data.n)
        labeled = np.asarray(data.labeled_index)
        return labeled[patterns[labeled].all(axis=1)]

    def fine_tuned(self, model: nn.Module) -> list[nn.Parameter]:
        return [*model.cross.parameters(), *model.bottom.parameters(), *model.top.parameters()]

    def loss(self, node, batch, stage: Stage) -> Objective:
        if stage is not Stage.PRETRAIN:
            return super().loss(node, batch, stage)
        local = self.local_losses(node, batch)
        for k, cross in self.cross_losses(node, batch).items():
            local[k] = local[k] + cross
        return Objective(node.active.map(lambda _: torch.zeros((), device=node.device)), local)

    def cross_losses(self, node, batch) -> dict[int, Tensor]:
        """Each party's cross-party SimSiam loss on the batch's aligned rows (zero when it has fewer than
        `ssl.MIN_ROWS`: on Isolet under MNAR, MAR or MCAR 0.5 an epoch's last batch holds none to three, and
        batch norm on so few blows the encoder up; the rounds still run, with zeros, so every step runs the
        table's rounds)."""
        aligned = torch.as_tensor(batch.patterns.all(axis=1), device=node.device)
        enough, width = int(aligned.sum()) >= MIN_ROWS, node.cfg.h_dim
        z, p = {}, {}
        for k, role in node.parties.items():
            z[k], p[k] = role.model.cross_heads(role.model.cross(batch.x[k][aligned])) if enough else (None, None)
        with torch.no_grad():  # the targets carry no gradient: these rounds have no adjoint
            addends = {k: _scatter(z[k].detach(), aligned) if enough else batch.x[k].new_zeros((batch.size, width))
                       for k in node.parties}
            total = node.transport.aggregate(CROSS_VIEW, addends)
            sums = node.transport.broadcast(CROSS_TARGET, total, (batch.size, width))
        if not enough:
            return {k: batch.x[k].new_zeros(()) for k in node.parties}
        others = node.cfg.parties - 1
        return {k: negative_cosine(p[k], (sums[k][aligned] - z[k].detach()) / others).mean() for k in node.parties}

    def end_epoch(self, node, stage: Stage) -> None:
        """The partial model aggregation after every stage-1 epoch: the shared parameters' secure mean."""
        if stage is not Stage.PRETRAIN:
            return
        with torch.no_grad():
            flat = {k: parameters_to_vector(role.model.shared()) for k, role in node.parties.items()}
            size = next(iter(flat.values())).numel()
            mean = node.transport.aggregate(MODEL_SUM, flat).map(lambda total: total / node.cfg.parties)
            for k, vector in node.transport.broadcast(MODEL_MEAN, mean, (size,)).items():
                _load(vector.to(node.device), node.parties[k].model.shared())


def _load(vector: Tensor, parameters: list[nn.Parameter]) -> None:
    """Copy `vector` into the parameters, each keeping its own storage (torch's `vector_to_parameters`
    would make them views of one tensor: in one process every party's parameters would then share it)."""
    start = 0
    for p in parameters:
        p.copy_(vector[start:start + p.numel()].view_as(p))
        start += p.numel()


def _scatter(rows: Tensor, aligned: Tensor) -> Tensor:
    """(B, E): `rows` at the aligned positions, exact zeros elsewhere."""
    out = rows.new_zeros((aligned.shape[0], rows.shape[-1]))
    out[aligned] = rows
    return out
