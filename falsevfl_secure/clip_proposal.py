"""A party's proposal of the [privacy] clip norms from its own rows, itself released with differential privacy.

A clip bounds how far one row moves each release, so it should sit near the rows' norms; chosen by looking at
the private rows in clear, it would disclose them, uncounted. Here a party runs, in its own process, one
stage-1 pass of a stand-in of its part (its block as the only rows of a two-party FALSE-VFL node, under DP's
contributions, nothing clipped or noised, nothing leaving the process) at its networks' initial weights, which
come from its own secret and never train on the rows: so each row's norm of each contribution (the three summed
rounds and its DP-SGD gradient, the latent gradient scaled to the row's own) is a function of that row and of
its own fresh draws alone. It releases only a histogram of each over public bins, every count with discrete
Gaussian noise from its own secret stream: adding or removing a row moves one count of each of the four
histograms by 1 (L2 sensitivity 2), so noise of standard deviation 2 x `multiplier` makes the release one
Gaussian mechanism of that multiplier, which the party's own ledger records and every later budget check
composes with its training (privacy.py). The proposal, a quantile of each noisy histogram, is post-processing.
Norms at the initial weights are not those of a trained model (a gradient's median on digits: 18 at the start,
131 after 10 epochs), so the proposal is a starting point.
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
from .train import run_stage
from .transport import LocalTransport
from .transport.rounds import Round

ROUNDS = ("posterior", "likelihood", "latent_grad")
NAMES = (*ROUNDS, "gradient")
EDGES = np.logspace(-4, 4, 65)  # public bins: 8 a decade; a norm beyond either end counts in the end bin
SENSITIVITY = 2.0  # a row adds 1 to one count in each of the 4 histograms: L2 norm sqrt(4)
LOOSE = 1e6  # the stand-in's clips: nothing is clipped, so the norms are the rows' own


class _Recorder:
    """The stand-in's noise stage at the party: it keeps each row's norm of each summed round and passes the
    value on unchanged (nothing leaves the process)."""

    def __init__(self) -> None:
        self.norms = {name: [] for name in ROUNDS}

    def apply(self, round: Round, value: Tensor, n_addends: int) -> Tensor:
        if round.name in self.norms:
            moved = value.detach().reshape(1, -1) if round.batch_axis is None else value.detach().movedim(
                round.batch_axis, 0)
            norms = moved.reshape(moved.shape[0], -1).double().norm(dim=1)
            # the gradient of a batch mean is 1 / B of the row's own: scaled back, no other row moves it
            self.norms[round.name].append(norms * (moved.shape[0] if round.name == "latent_grad" else 1))
        return value


class _Passing:
    def apply(self, round: Round, value: Tensor, n_addends: int) -> Tensor:
        return value


def stand_in(cfg: Config, rows: int) -> Config:
    """The party's own model settings as a two-party node (the party and an active party holding no row),
    stage 1 only, under DP's contributions (centred likelihoods, unit precisions) with nothing clipped or noised."""
    loose = dict(clip_posterior=LOOSE, clip_likelihood=LOOSE, clip_latent_grad=LOOSE, clip_gradient=LOOSE)
    privacy = replace(cfg.privacy, epsilon=cfg.privacy.epsilon or 1.0, noise_multiplier=1e-12, collusion=0, **loose)
    sized = sized_schedule(cfg, rows, 0)
    return replace(sized, parties=2, active_party=1, privacy=privacy,
                   pretrain=replace(sized.pretrain, epochs=1), train=replace(sized.train, epochs=0))


def measure_norms(cfg: Config, x: np.ndarray, observed: np.ndarray, layout: CellLayout | None,
                  secrets: dict[int, RoleSecret] | None = None, records: int | None = None) -> dict[str, np.ndarray]:
    """Each row's norm of the party's contribution to every summed round and of its DP-SGD gradient, from one
    stage-1 pass at the initial weights (no optimiser step: no row moves another's norm). The latent gradient of
    a batch mean is scaled by its batch's size to the row's own, then divided by the batch training will use
    (`records`: the shared order's size where known, else the party's rows). `secrets`: tests' (the party 0,
    the stand-in's active party 1); a run draws fresh ones."""
    n, width = x.shape
    run = stand_in(cfg, n)
    transport, recorder = LocalTransport(2, 1), _Recorder()
    node = build_node(run, {0: width, 1: 1}, 2, transport, torch.device("cpu"),
                      secrets, {0: layout} if layout is not None else None)
    transport.use_noise({0: recorder, 1: _Passing()})
    gradients = node.private[0]
    gradients.seen = []
    data = HostedData(n, {0: torch.from_numpy(x), 1: torch.zeros(n, 1)},
                      {0: torch.ones(n, dtype=torch.bool), 1: torch.zeros(n, dtype=torch.bool)},
                      Active(torch.ones(n)), Active(torch.zeros(n, dtype=torch.long)), np.arange(0),
                      observed={} if observed.all() else {0: torch.from_numpy(observed)})
    run_stage(node, data, Stage.PRETRAIN, {}, progress=False)  # no optimiser: the weights stay initial
    norms = {name: torch.cat(recorder.norms[name]).cpu().numpy() for name in ROUNDS}
    norms["latent_grad"] = norms["latent_grad"] / sized_schedule(cfg, records or n, 0).pretrain.batch_size
    return {**norms, "gradient": torch.cat(gradients.seen).cpu().numpy()}


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
