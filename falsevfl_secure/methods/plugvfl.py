"""PlugVFL (paper, App. D.1): every labeled row, zeros for a party that does not hold it; in training each
passive party's block is dropped with probability 0.5 (the active party's never), its label-protection
objective off.

Who drops: each passive party itself, per row (or, with `plug_drop = "batch"`, per mini-batch, as the
LASER-VFL code's PlugVFL that the paper adopts), from its own secret stream. Its addend to the sum is then
zeros, which under a secure protocol the active party cannot tell from a row the party does not hold; the
mean is over all K parties, so nobody needs to know which blocks were dropped."""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import StageConfig
from .base import Option, register
from .fusion import EmbeddingFusion, baseline_schedule, sgd

DROP_RATE = 0.5
DROP_STREAM = "party/plugvfl/drop"


def _plug(pretrain: StageConfig, train: StageConfig) -> dict:
    """Under `paper-protocol`: a passive party dropped per mini-batch (the LASER-VFL code's PlugVFL)."""
    return baseline_schedule(pretrain, train, plug_drop="batch")


@register
class PlugVfl(EmbeddingFusion):
    name = "plugvfl"
    options = {**EmbeddingFusion.options,
               "plug_drop": Option(("row", "batch"), "PlugVFL drops a passive party per row or per mini-batch")}
    schedules = {"isolet": _plug(sgd(0.025, 512, 100), StageConfig(5e-5, 32, 100)),
                 "hapt": _plug(sgd(0.02, 512, 150), StageConfig(5e-4, 64, 100)),
                 "fashion-mnist": _plug(sgd(0.02, 1024, 100), StageConfig(1e-4, 128, 150)),
                 "digits": _plug(sgd(0.025, 128, 40), StageConfig(1e-3, 32, 60))}

    def contribution(self, node, batch, k: int, training: bool) -> Tensor:
        addend = super().contribution(node, batch, k, training)
        if not training or k == node.cfg.active_index:
            return addend
        # one draw for the batch, or one per row
        draws = 1 if self.settings["plug_drop"] == "batch" else addend.shape[0]
        keep = node.parties[k].randomness.stream(DROP_STREAM).uniform(draws).expand(addend.shape[0]) >= DROP_RATE
        return torch.where(keep.to(addend.device).unsqueeze(-1), addend, torch.zeros_like(addend))
