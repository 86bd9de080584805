"""Vanilla VFL (paper, App. D.1): fine-tuned only on the labeled rows every party holds; at test a missing
party's embedding is zeros (the mean over K parties then counts it as zero)."""

from __future__ import annotations

import numpy as np

from ..config import Stage
from .base import patterns_of
from .fusion import EmbeddingFusion


class Vanilla(EmbeddingFusion):
    name = "vanilla"
    needs_patterns = True
    row_rule = {Stage.PRETRAIN: "every row", Stage.TRAIN: "the labeled rows every party holds"}

    def rows(self, stage: Stage, data) -> np.ndarray:
        if stage is Stage.PRETRAIN:
            return np.arange(data.n)
        labeled = np.asarray(data.labeled_index)
        return labeled[patterns_of(data, self.name)[labeled].all(axis=1)]
