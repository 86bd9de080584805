"""FALSE-VFL's bounds and prediction rule as pure functions of already-computed log densities.

Notation (paper, "Our Method"): kappa importance samples (h_j, z_j) ~ q(h | x_obs) q(z | h); the
log importance weight of sample j is

    log w_j = log p(x_obs | h_j) + log p(h_j | z_j) + log p(z_j) - log q(h_j | x_obs) - log q(z_j | h_j)

(FALSE-VFL-II adds log p(m | x_obs, x_mis_j) to the first term). All tensors here are laid out
(kappa, B): importance samples first, then the batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Normal

PRECISION_FLOOR = 1e-3  # model.party.MIN_PRECISION, the least precision one party's term carries


def latent_posterior(sum_mean: Tensor, sum_precision: Tensor, n_observed: Tensor) -> Normal:
    """q(h | x_obs), the paper's equation (1): the mean of the observed parties' means and the
    inverse of the sum of their (diagonal) precisions.

    `sum_mean` and `sum_precision` are sums over the observed parties only (a party contributes
    zeros for samples it does not hold), so dividing by the number of observed parties gives the mean.
    """
    mean = sum_mean / n_observed.to(sum_mean.dtype).unsqueeze(-1)
    # Every party adds at least PRECISION_FLOOR, so only DP noise (PrivacyConfig) brings a sum below it.
    return Normal(mean, sum_precision.clamp(min=PRECISION_FLOOR).rsqrt())


def log_importance_weights(
    log_likelihood: Tensor,
    log_p_h_given_z: Tensor,
    log_p_z: Tensor,
    log_q_h: Tensor,
    log_q_z: Tensor,
) -> Tensor:
    """log w_j for every (importance sample, batch row); every argument is (kappa, B)."""
    return log_likelihood + log_p_h_given_z + log_p_z - log_q_h - log_q_z


def iwae_bound(log_w: Tensor) -> Tensor:
    """Per-sample kappa-sample IWAE bound log (1/kappa) sum_j w_j, shape (B,)."""
    return torch.logsumexp(log_w, dim=0) - math.log(log_w.shape[0])


def conditional_bound(log_w: Tensor, log_p_y: Tensor) -> Tensor:
    """Per-sample L'_kappa: log (1/kappa) sum_j p(y | h_j) w_j, shape (B,). Stage 2 maximises it over
    the discriminator only; with the generative part frozen, log_w is a constant there."""
    return torch.logsumexp(log_w + log_p_y, dim=0) - math.log(log_w.shape[0])


def snis_weights(log_w: Tensor) -> Tensor:
    """Self-normalised importance weights over the L samples, shape (L, B), columns sum to 1."""
    return torch.softmax(log_w, dim=0)


def snis_predict(log_w: Tensor, probabilities: Tensor) -> Tensor:
    """p(y | x_obs) ~ sum_l w_l p(y | h_l) (paper, "Prediction"): `probabilities` is (L, B, C)."""
    return torch.einsum("lb,lbc->bc", snis_weights(log_w), probabilities)


def diagonal_gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Sum over the last axis of log N(x; mean, diag(std^2)); written out rather than via
    `Normal.log_prob(...).sum(-1)` to avoid materialising the per-feature tensor twice."""
    z = (x - mean) / std
    return -0.5 * (z * z).sum(-1) - std.log().sum(-1) - 0.5 * math.log(2 * math.pi) * x.shape[-1]


def observed_gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor, observed: Tensor) -> Tensor:
    """Sum over the observed cells of the last axis of log N(x; mean, std^2) (`observed`: bool,
    broadcastable to x): the log-density of the observed part of x, as MIWAE scores a row with
    missing cells. Unobserved cells add exactly 0 and pass no gradient to mean or std (`torch.where`);
    x must be finite there (the caller imputes them)."""
    z = (x - mean) / std
    cells = -0.5 * (z * z) - std.log() - 0.5 * math.log(2 * math.pi)
    return torch.where(observed, cells, torch.zeros_like(cells)).sum(-1)
