"""A party's proposal of the [privacy] clip norms from its own rows, itself released with differential privacy.

A clip bounds how far one row moves each release, so it should sit near the rows' norms; chosen by looking at
the private rows in clear, it would disclose them, uncounted. Here a party measures, on a stand-in of its
training that runs in its own process (its block as the only rows of a two-party FALSE-VFL node, stage 1 for a
few epochs, its networks trained on its own rows; nothing leaves the process), the per-row norm of each of its
contributions in the last epoch: the three summed rounds and its DP-SGD gradient. It releases only a histogram
of each over public bins, every count with discrete Gaussian noise from its own secret stream: adding or
removing a row moves one count of each of the four histograms by 1 (L2 sensitivity 2), so the noise of standard
deviation 2 x `multiplier` makes the release one Gaussian mechanism of that multiplier, which the party's own
ledger records and every later budget check composes with its training (privacy.py). The proposal, a quantile
of each noisy histogram, is post-processing. The stand-in's norms are those of a model trained on this party's
rows alone: the federation's differ (other parties join the posterior), so the proposal is a starting point.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from .config import Config, Stage, sized_schedule
from .methods import build_node
from .model.likelihood import CellLayout
from .node import HostedData
from .placement import Active
from .randomness import KeyStream, RoleSecret
from .secure.discrete_gaussian import discrete_gaussian
from .train import optimizers_for, run_stage
from .transport import LocalTransport
from .transport.rounds import Round

ROUNDS = ("posterior", "likelihood", "latent_grad")
NAMES = (*ROUNDS, "gradient")
EDGES = np.logspace(-4, 4, 65)  # public bins: 8 a decade; a norm beyond either end counts in the end bin
SENSITIVITY = 2.0  # a row adds 1 to one count in each of the 4 histograms: L2 norm sqrt(4)
LOOSE = 1e6  # the stand-in's clips: nothing is clipped, so the norms are the rows' own


class _Recorder:
    """The stand-in's noise stage at the party: it keeps each row's norm of each summed round while `on`, and
    passes the value on unchanged (nothing leaves the process)."""

    def __init__(self) -> None:
        self.on, self.norms = False, {name: [] for name in ROUNDS}

    def apply(self, round: Round, value: Tensor, n_addends: int) -> Tensor:
        if self.on and round.name in self.norms:
            moved = value.detach().reshape(1, -1) if round.batch_axis is None else value.detach().movedim(
                round.batch_axis, 0)
            self.norms[round.name].append(moved.reshape(moved.shape[0], -1).double().norm(dim=1))
        return value


class _Passing:
    def apply(self, round: Round, value: Tensor, n_addends: int) -> Tensor:
        return value


def stand_in(cfg: Config, rows: int, epochs: int) -> Config:
    """The party's own model settings as a two-party node (the party and an active party holding no row),
    stage 1 only, under DP's contributions (centred likelihoods, unit precisions) with nothing clipped or noised."""
    loose = dict(clip_posterior=LOOSE, clip_likelihood=LOOSE, clip_latent_grad=LOOSE, clip_gradient=LOOSE)
    privacy = replace(cfg.privacy, epsilon=cfg.privacy.epsilon or 1.0, noise_multiplier=1e-12, collusion=0, **loose)
    sized = sized_schedule(cfg, rows, 0)
    return replace(sized, parties=2, active_party=1, privacy=privacy,
                   pretrain=replace(sized.pretrain, epochs=epochs), train=replace(sized.train, epochs=0))


def measure_norms(cfg: Config, x: np.ndarray, observed: np.ndarray, layout: CellLayout | None, epochs: int,
                  secret: RoleSecret | None = None, records: int | None = None,
                  progress: bool = False) -> dict[str, np.ndarray]:
    """Each row's norm of the party's contribution to every summed round and of its DP-SGD gradient, in the last
    of `epochs` stage-1 epochs of the stand-in (one norm per row and name). `records`: the shared order's size,
    where known, so the stand-in's batch is training's (the latent gradient of a batch mean scales with 1 / B)."""
    n, width = x.shape
    run = stand_in(cfg, records or n, epochs)
    transport, recorder = LocalTransport(2, 1), _Recorder()
    node = build_node(run, {0: width, 1: 1}, 2, transport, torch.device("cpu"),
                      {0: secret} if secret is not None else None, {0: layout} if layout is not None else None)
    transport.use_noise({0: recorder, 1: _Passing()})
    gradients, seen = node.private[0], []
    data = HostedData(n, {0: torch.from_numpy(x), 1: torch.zeros(n, 1)},
                      {0: torch.ones(n, dtype=torch.bool), 1: torch.zeros(n, dtype=torch.bool)},
                      Active(torch.ones(n)), Active(torch.zeros(n, dtype=torch.long)), np.arange(0),
                      observed={} if observed.all() else {0: torch.from_numpy(observed)})

    def last(on: bool) -> None:
        recorder.on, gradients.seen = on, seen if on else None

    last(epochs == 1)
    run_stage(node, data, Stage.PRETRAIN, optimizers_for(node, Stage.PRETRAIN), progress=progress,
              on_epoch_end=lambda stage, epoch, _: last(epoch == epochs - 2))
    return {**{name: torch.cat(recorder.norms[name]).numpy() for name in ROUNDS},
            "gradient": torch.cat(seen).numpy()}


def release(norms: dict[str, np.ndarray], multiplier: float, stream: KeyStream) -> dict[str, np.ndarray]:
    """The histograms of the norms over `EDGES`, each count plus discrete Gaussian noise of standard deviation
    SENSITIVITY x `multiplier` from the party's own stream: one Gaussian mechanism of that multiplier."""
    variance = math.ceil((SENSITIVITY * multiplier) ** 2)
    out = {}
    for name in NAMES:
        counts = np.bincount(np.searchsorted(EDGES, norms[name]), minlength=len(EDGES) + 1)
        out[name] = counts + discrete_gaussian(variance, counts.size, stream)
    return out


def quantile(counts: np.ndarray, q: float) -> float:
    """The upper edge of the first bin where the noisy counts (negative ones as 0) reach a share `q` of all."""
    clean = np.maximum(counts, 0)
    if clean.sum() <= 0:
        return math.nan
    return float(EDGES[min(int(np.searchsorted(np.cumsum(clean), q * clean.sum())), len(EDGES) - 1)])
