"""Vanilla VFL (paper, App. D.1): fine-tuned only on the labeled rows every party holds; at test a missing
party's embedding is zeros (the mean over K parties then counts it as zero)."""

from __future__ import annotations

import numpy as np

from ..config import Stage, StageConfig
from .base import patterns_of, register
from .fusion import EmbeddingFusion, baseline_schedule, sgd


@register
class Vanilla(EmbeddingFusion):
    name = "vanilla"
    schedules = {"isolet": baseline_schedule(sgd(0.025, 512, 100), StageConfig(5e-4, 32, 500)),
                 "hapt": baseline_schedule(sgd(0.02, 512, 150), StageConfig(5e-3, 64, 100)),
                 "fashion-mnist": baseline_schedule(sgd(0.02, 1024, 100), StageConfig(1e-4, 128, 150)),
                 "digits": baseline_schedule(sgd(0.025, 128, 40), StageConfig(1e-3, 32, 100))}
    needs_patterns = True
    row_rule = {Stage.PRETRAIN: "every row", Stage.TRAIN: "the labeled rows every party holds"}

    def rows(self, stage: Stage, data) -> np.ndarray:
        if stage is Stage.PRETRAIN:
            return np.arange(data.n)
        labeled = np.asarray(data.labeled_index)
        return labeled[patterns_of(data, self.name)[labeled].all(axis=1)]
