"""The feature-side modules that one party owns and runs on its own feature block only.

A `PartyModel` never sees another party's data: its inputs are its block x^k, the rows it holds,
and (from the active party's broadcast) latent samples h. Its outputs are the two contributions
it adds into the cross-party sums: the posterior terms and the log-likelihood terms.

The arithmetic after the networks lives in module-level functions that accept any leading axes, so
that `PartyStack` (several parties of one process evaluated as batched matrix products) runs
exactly the same formulas with a leading party axis.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..bounds import diagonal_gaussian_log_prob
from ..randomness import KeyStream
from .mlp import mlp

MIN_PRECISION = 1e-3


def posterior_terms(encoded: Tensor, held: Tensor) -> Tensor:
    """[mu_k, precision_k] from the encoder output (..., B, 2 d_h) for the rows held ((..., B) bool)
    and exact zeros elsewhere.

    Zeros (not NaN-prone multiplications) so that the values of rows the party does not hold
    cannot change the sum: `torch.where` also blocks their gradients.
    """
    mean, raw_precision = encoded.chunk(2, dim=-1)
    contribution = torch.cat([mean, F.softplus(raw_precision) + MIN_PRECISION], dim=-1)
    return torch.where(held.unsqueeze(-1), contribution, torch.zeros_like(contribution))


def decoder_gaussian(decoded: Tensor, min_std: float) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation of p(x^k | h) from the decoder output; the std has a floor so
    that the likelihood of standardised data cannot diverge by collapsing a variance."""
    mean, raw_std = decoded.chunk(2, dim=-1)
    return mean, F.softplus(raw_std) + min_std


def likelihood_terms(mean: Tensor, std: Tensor, x: Tensor, held: Tensor,
                     indicator: Callable[[Tensor], Tensor] | None = None, noise: Tensor | None = None) -> Tensor:
    """One party's term of the summed log-likelihood, (..., S, B), from p(x^k | h_j) = N(mean, std^2)
    of shape (..., S, B, d), its block x (..., B, d) and held rows (..., B).

    FALSE-VFL-I: log p(x^k | h_j) on held rows, 0 elsewhere.
    FALSE-VFL-II (`indicator` given): plus log p(m^k | x^k) on every row, where a row the party does
    not hold uses x^k_j = mean + std * noise, a reparameterised draw from its own decoder.
    """
    x_s, held_s = x.unsqueeze(-3), held.unsqueeze(-2)  # broadcast over the S importance samples
    log_lik = diagonal_gaussian_log_prob(x_s, mean, std)
    term = torch.where(held_s, log_lik, torch.zeros_like(log_lik))
    if indicator is None:
        return term
    imputed = mean + std * noise
    x_full = torch.where(held_s.unsqueeze(-1), x_s.expand_as(imputed), imputed)
    logit = indicator(x_full).squeeze(-1)
    # m = 1 means "missing": log p(m=1|x) = log sigmoid(logit), log p(m=0|x) = log sigmoid(-logit).
    return term + F.logsigmoid(torch.where(held_s, -logit, logit))


class PartyModel(nn.Module):
    """Encoder q(h | x^k) -> (mu_k, precision_k), decoder p(x^k | h) (Gaussian) and, for
    FALSE-VFL-II, the missing indicator p(m^k | x^k) (Bernoulli)."""

    def __init__(
        self,
        n_features: int,
        h_dim: int,
        hidden: int,
        variant: str = "I",
        min_decoder_std: float = 0.05,
        indicator_hidden: int = 64,
    ) -> None:
        super().__init__()
        self.n_features = n_features
        self.h_dim = h_dim
        self.variant = variant
        self.min_decoder_std = min_decoder_std
        self.encoder = mlp([n_features, hidden, 2 * h_dim])
        self.decoder = mlp([h_dim, hidden, 2 * n_features])
        self.indicator = (
            mlp([n_features, indicator_hidden, indicator_hidden, 1]) if variant == "II" else None
        )

    # -- generative-side parameters are everything here: stage 2 freezes the whole party model --

    def posterior_contribution(self, x: Tensor, held: Tensor) -> Tensor:
        """[mu_k, precision_k] for the rows this party holds and exact zeros elsewhere, (B, 2 d_h)."""
        return posterior_terms(self.encoder(x), held)

    def decode(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and standard deviation of p(x^k | h)."""
        return decoder_gaussian(self.decoder(h), self.min_decoder_std)

    def log_likelihood_contribution(self, h: Tensor, x: Tensor, held: Tensor, noise: KeyStream | None = None) -> Tensor:
        """This party's term of the summed log-likelihood, shape (kappa, B) (see `likelihood_terms`);
        FALSE-VFL-II draws the imputation noise from this party's own secret `noise` stream."""
        mean, std = self.decode(h)
        draws = None
        if self.indicator is not None:
            draws = noise.normal(tuple(mean.shape), mean.dtype, mean.device)
        return likelihood_terms(mean, std, x, held, self.indicator, draws)
