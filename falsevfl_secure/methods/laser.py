"""LASER-VFL (Valdeira et al., 2024) with one fusion model, at the active party (paper, App. D.1).

The predictors over subsets of parties share every parameter: the predictor of a subset S is the fusion
model applied to the mean of S's embeddings. Training uses every labeled row, in mini-batches whose rows
share one observed set O (rows grouped by their public pattern); each step samples, for every size
m = 1..|O|, one subset of O of that size (task sampling, a public draw: it depends on nothing secret and
every party must know which subsets it contributes to) and minimises sum_m C(|O|, m) * loss(S_m), an
unbiased estimate of the sum of the losses of every subset of O (the objective of LASER-VFL's heads, which
one fusion model pools; `laser_batches` "grouped-full" keeps full batches only, "plain" shuffles the rows as
every other method does, each row then averaging the subset's parties that hold it). The subsets' sums
travel as one `subsets` round (T, B, E). At test the predictor of the row's observed subset: the mean over
the parties that hold it (the active party knows how many do), one `embedding` sum."""

from __future__ import annotations

import math
from dataclasses import replace
from math import comb

import numpy as np
import torch
from torch import Tensor

from ..config import Stage, StageConfig
from ..data.loaders import DEFAULT_LABELED, TABULAR_DEFAULT
from ..placement import Active, apply
from ..randomness import PublicGenerator, PublicStream, public_rng
from ..transport.rounds import EMBEDDING, SUBSETS, SUBSETS_GRAD, RoundTable
from .base import Objective, Option, patterns_of, register
from .fusion import EmbeddingFusion, baseline_schedule, sgd


def draw_subsets(observed: np.ndarray, rng: PublicGenerator) -> np.ndarray:
    """(|O|, K) bool: for m = 1..|O|, one subset of the observed parties `observed` (K,) of size m."""
    members = np.flatnonzero(observed)
    subsets = np.zeros((len(members), len(observed)), dtype=bool)
    for size in range(1, len(members) + 1):
        subsets[size - 1, rng.choice(members, size, replace=False)] = True
    return subsets


def grouped(rows: np.ndarray, patterns: np.ndarray, batch_size: int, rng: PublicGenerator,
            full_only: bool = False) -> list[np.ndarray]:
    """Mini-batches of `rows` (shuffled by `rng`) in which every row has the same pattern, in random order;
    with `full_only`, only batches of exactly `batch_size` rows (each group's remainder is left out)."""
    order = rows[rng.permutation(len(rows))]
    keys = patterns[order].astype(np.int64) @ (np.int64(1) << np.arange(patterns.shape[1], dtype=np.int64))
    batches = []
    for key in dict.fromkeys(keys.tolist()):
        members = order[keys == key]
        end = len(members) - len(members) % batch_size if full_only else len(members)
        batches += [members[i:i + batch_size] for i in range(0, end, batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def _laser(dataset: str, pretrain: StageConfig, train: StageConfig) -> dict:
    """Under `paper-protocol`: stage 2 at the step count the paper's table states, epochs x ceil(labeled rows /
    batch size) (its grouped batches are many more and mostly tiny: README)."""
    labeled = DEFAULT_LABELED.get(dataset, TABULAR_DEFAULT)[0]
    schedule = baseline_schedule(pretrain, train)
    schedule["paper-protocol"]["train"] = replace(train, steps_per_epoch=math.ceil(labeled / train.batch_size))
    return schedule


@register
class Laser(EmbeddingFusion):
    name = "laser"
    needs_patterns = True
    rounds = RoundTable({Stage.TRAIN: (SUBSETS, SUBSETS_GRAD), Stage.PREDICT: (EMBEDDING,)})
    # Stage 2's batches: "grouped" (the rows of one observed set, every group cut into batches of at most
    # batch_size: the paper's "mini-batches that share a single mask"), "grouped-full" (the same, only full
    # batches: the rest of each group waits for a later epoch's shuffle), "plain" (shuffled batches, each row
    # its own set of parties, as every other method).
    options = {"laser_batches": Option(("grouped", "grouped-full", "plain"), "LASER-VFL's batches: grouped by "
                                       "observed set, only full such batches, or plain shuffles")}
    schedules = {"isolet": _laser("isolet", sgd(0.025, 512, 100), StageConfig(5e-5, 64, 200)),
                 "hapt": _laser("hapt", sgd(0.02, 512, 150), StageConfig(1e-3, 128, 100)),
                 "fashion-mnist": _laser("fashion-mnist", sgd(0.02, 1024, 100), StageConfig(1e-4, 128, 100)),
                 "digits": _laser("digits", sgd(0.025, 128, 40), StageConfig(1e-3, 32, 60))}

    @property
    def batches(self) -> str:
        return self.settings["laser_batches"]

    def plan(self, stage: Stage, data, epoch: int, seed: int, batch_size: int) -> list[np.ndarray]:
        if stage is not Stage.TRAIN or self.batches == "plain":
            return super().plan(stage, data, epoch, seed, batch_size)
        rng = public_rng(seed, PublicStream.BATCH_ORDER, int(stage), epoch)
        return grouped(self.rows(stage, data), patterns_of(data, self.name), batch_size, rng,
                       full_only=self.batches == "grouped-full")

    def batch(self, data, rows: np.ndarray, stage: Stage, epoch: int, index: int, seed: int = 0):
        batch = super().batch(data, rows, stage, epoch, index, seed)
        if stage is Stage.TRAIN:
            observed = patterns_of(data, self.name)[rows].any(axis=0)
            batch.subsets = draw_subsets(observed, public_rng(seed, PublicStream.SUBSETS, epoch, index))
        return batch

    def subset_addend(self, node, batch, subsets: Tensor, k: int) -> Tensor:
        """Party k's addends (T, B, E): its embedding where it holds the row and is in subset t, else zeros."""
        embedding = node.parties[k].model.embed(batch.x[k])
        mask = subsets[:, k].unsqueeze(-1) & batch.held[k].unsqueeze(0)
        return torch.where(mask.unsqueeze(-1), embedding.unsqueeze(0), torch.zeros_like(embedding).unsqueeze(0))

    def loss(self, node, batch, stage: Stage) -> Objective:
        if stage is not Stage.TRAIN:
            return super().loss(node, batch, stage)
        subsets = torch.as_tensor(batch.subsets, device=node.device)
        addends = {k: self.subset_addend(node, batch, subsets, k) for k in node.parties}
        total = node.transport.aggregate(SUBSETS, addends)
        patterns = torch.as_tensor(batch.patterns, device=node.device)
        return Objective(apply(lambda role, t, y: _subsets_loss(role.model, t, y, subsets, patterns), node.active,
                               total, batch.y))

    @torch.no_grad()
    def predict(self, node, batch) -> Active[Tensor]:
        addends = {k: self.contribution(node, batch, k, training=False) for k in node.parties}
        total = node.transport.aggregate(EMBEDDING, addends)
        fused = apply(lambda t, n: t / n.to(t.dtype).unsqueeze(-1), total, batch.n_observed)
        return apply(lambda role, f: role.model.predict(f), node.active, fused)


def _subsets_loss(head, total: Tensor, y: Tensor, subsets: Tensor, patterns: Tensor) -> Tensor:
    """sum_t C(|O|, |S_t|) * mean over rows of -log p(y | mean of S_t's embeddings held by the row)."""
    counts = (subsets.unsqueeze(1) & patterns.unsqueeze(0)).sum(-1)  # (T, B): the parties of S_t holding the row
    log_p = head.log_prob(total / counts.clamp(min=1).unsqueeze(-1).to(total.dtype), y)
    valid = (counts > 0).to(log_p.dtype)
    per_subset = (log_p * valid).sum(-1) / valid.sum(-1).clamp(min=1)
    observed = int(patterns.any(dim=0).sum())
    weights = torch.tensor([comb(observed, int(size)) for size in subsets.sum(-1)], dtype=log_p.dtype,
                           device=log_p.device)
    return -(weights * per_subset).sum()
