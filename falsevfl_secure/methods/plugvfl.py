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

from .fusion import EmbeddingFusion

DROP_RATE = 0.5
DROP_STREAM = "party/plugvfl/drop"


class PlugVfl(EmbeddingFusion):
    name = "plugvfl"

    def contribution(self, node, batch, k: int, training: bool) -> Tensor:
        addend = super().contribution(node, batch, k, training)
        if not training or k == node.cfg.active_index:
            return addend
        draws = 1 if node.cfg.plug_drop == "batch" else addend.shape[0]  # one draw for the batch, or one per row
        keep = node.parties[k].randomness.stream(DROP_STREAM).uniform(draws).expand(addend.shape[0]) >= DROP_RATE
        return torch.where(keep.to(addend.device).unsqueeze(-1), addend, torch.zeros_like(addend))
