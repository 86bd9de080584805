"""The label-side modules that only the active party owns: the global encoder q(z | h), the global
decoder p(h | z), the prior p(z) = N(0, I) and the discriminator p(y | h) or, with `own_inputs`, p(y | h,
x_active): the active party's own block where it holds the record (`own_features`), which it holds in clear."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..bounds import diagonal_gaussian_log_prob, latent_posterior, log_importance_weights
from ..errors import InputError
from ..randomness import KeyStream
from .mlp import mlp

MIN_STD = 1e-3


def _gaussian_head(raw: Tensor) -> tuple[Tensor, Tensor]:
    mean, raw_std = raw.chunk(2, dim=-1)
    return mean, F.softplus(raw_std.contiguous()) + MIN_STD  # on a strided half, torch 2.13's softplus is 15x slower


class ActiveModel(nn.Module):
    """Everything the active party computes between the two aggregates and for the loss."""

    def __init__(
        self,
        h_dim: int,
        z_dim: int,
        hidden: int,
        n_classes: int,
        discriminator_hidden: int,
        task: str = "classification",
        own_inputs: int = 0,
        unit_precision: bool = False,
        noise_var: float = 0.0,
        signal_var: float = 1.0,
    ) -> None:
        super().__init__()
        self.h_dim, self.z_dim, self.task, self.n_classes = h_dim, z_dim, task, n_classes
        # Under DP: each holder's precision is 1, not a noised sum; the noised sum of means is shrunk by
        # signal / (signal + noise) per value (the sum's noise variance, and a holder's signal variance bound).
        self.unit_precision, self.noise_var, self.signal_var = unit_precision, noise_var, signal_var
        self.own_inputs = own_inputs  # width of `own_features` (0: the paper's p(y | h))
        self.global_encoder = mlp([h_dim, hidden, hidden, 2 * z_dim])
        self.global_decoder = mlp([z_dim, hidden, hidden, 2 * h_dim])
        n_out = n_classes if task == "classification" else 2
        self.discriminator = mlp([h_dim + own_inputs, discriminator_hidden, n_out])

    def generative_parameters(self) -> list[nn.Parameter]:
        """theta_s and gamma_s: frozen in stage 2 together with every party's parameters."""
        return [*self.global_encoder.parameters(), *self.global_decoder.parameters()]

    def sample_latent(self, sum_posterior: Tensor, n_observed: Tensor, kappa: int,
                      noise: KeyStream) -> tuple[Tensor, Tensor]:
        """Draw h_1..h_kappa ~ q(h | x_obs) (reparameterised, from the active party's secret `noise`
        stream) and return (h, log q(h | x_obs)).

        `sum_posterior` is the aggregate of the parties' [mu_k, precision_k], shape (B, 2 d_h).
        """
        loc, scale = self.latent_moments(sum_posterior, n_observed)
        h = loc + scale * noise.normal((kappa, *loc.shape), loc.dtype, loc.device)
        return h, diagonal_gaussian_log_prob(h, loc, scale)

    def latent_moments(self, sum_posterior: Tensor, n_observed: Tensor) -> tuple[Tensor, Tensor]:
        """The mean and standard deviation (B, d_h) each of q(h | x_obs) from the aggregated posterior terms."""
        sum_mean, sum_precision = sum_posterior.split(self.h_dim, dim=-1)
        if self.unit_precision:
            holders = n_observed.to(sum_mean.dtype).unsqueeze(-1)
            signal = holders * self.signal_var
            sum_mean = sum_mean * (signal / (signal + self.noise_var))
            sum_precision = holders.expand_as(sum_mean)
        q_h = latent_posterior(sum_mean, sum_precision, n_observed)
        return q_h.loc, q_h.scale

    def global_terms(self, h: Tensor, noise: KeyStream) -> tuple[Tensor, Tensor, Tensor]:
        """log p(h_j | z_j), log p(z_j) and log q(z_j | h_j), (kappa, B) each, of z_j ~ q(z | h_j): they read
        the latent samples only, so the active party computes them while the parties compute their likelihoods."""
        z_mean, z_std = _gaussian_head(self.global_encoder(h))
        z = z_mean + z_std * noise.normal(tuple(z_mean.shape), h.dtype, h.device)
        log_q_z = diagonal_gaussian_log_prob(z, z_mean, z_std)
        h_mean, h_std = _gaussian_head(self.global_decoder(z))
        log_p_h = diagonal_gaussian_log_prob(h, h_mean, h_std)
        log_p_z = -0.5 * (z * z).sum(-1) - 0.5 * math.log(2 * math.pi) * self.z_dim
        return log_p_h, log_p_z, log_q_z

    @staticmethod
    def log_weights(log_q_h: Tensor, log_likelihood: Tensor, terms: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """log w_j of the IWAE bound, (kappa, B): the summed likelihoods with the samples' `global_terms`."""
        log_p_h, log_p_z, log_q_z = terms
        return log_importance_weights(log_likelihood, log_p_h, log_p_z, log_q_h, log_q_z)

    def discriminate(self, h: Tensor, own: Tensor | None = None) -> Tensor:
        """The discriminator's output for every sample (S, B, n_out); `own` (B, own_inputs) joins each sample."""
        if not self.own_inputs:
            return self.discriminator(h)
        if own is None or own.shape != (h.shape[-2], self.own_inputs):
            raise InputError(f"the discriminator reads the active party's own block: expected ({h.shape[-2]}, "
                             f"{self.own_inputs}) inputs, got {None if own is None else tuple(own.shape)}")
        return self.discriminator(torch.cat([h, own.to(h.dtype).expand(*h.shape[:-2], *own.shape)], dim=-1))

    def label_log_prob(self, h: Tensor, y: Tensor, own: Tensor | None = None) -> Tensor:
        """log p(y | h_j[, x_active]) for every importance sample, (kappa, B)."""
        out = self.discriminate(h, own)
        if self.task == "classification":
            if y.dtype not in (torch.int64, torch.int32) or (
                y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.n_classes)
            ):
                raise InputError(f"labels must be integers in 0..{self.n_classes - 1}")
            log_probs = out.log_softmax(-1)
            return log_probs.gather(-1, y.view(1, -1, 1).expand(h.shape[0], -1, 1)).squeeze(-1)
        mean, std = _gaussian_head(out)
        return diagonal_gaussian_log_prob(y.view(1, -1, 1).to(h.dtype), mean, std)

    def label_distribution(self, h: Tensor, own: Tensor | None = None) -> Tensor:
        """p(y | h_l[, x_active]): class probabilities (L, B, C), or (mean, std) pairs (L, B, 2) for regression."""
        out = self.discriminate(h, own)
        if self.task == "classification":
            return out.softmax(-1)
        return torch.stack(_gaussian_head(out), dim=-1).squeeze(-2)


def own_features(x: Tensor, held: Tensor, observed: Tensor | None) -> Tensor:
    """The active party's own inputs to the discriminator, (B, 2 d + 1): its block (0 where a cell is empty
    or the row not held), which cells it observes, and whether it holds the row."""
    held_f = held.to(x.dtype).unsqueeze(-1)
    seen = held_f.expand_as(x) if observed is None else observed.to(x.dtype) * held_f
    return torch.cat([x * seen, seen, held_f], dim=-1)


def own_width(width: int) -> int:
    """The width of `own_features` for a block of `width` cells."""
    return 2 * width + 1


def balanced_weights(y: Tensor, n_classes: int) -> Tensor:
    """scikit-learn's "balanced" class weights n / (C n_c) of labels `y` (a class without a row gets 0)."""
    counts = torch.bincount(y.long(), minlength=n_classes).to(torch.float32)
    return torch.where(counts > 0, y.numel() / (n_classes * counts.clamp(min=1)), torch.zeros_like(counts))
