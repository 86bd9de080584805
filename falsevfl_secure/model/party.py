"""The feature-side modules that one party owns and runs on its own feature block only.

A `PartyModel` never sees another party's data: its inputs are its block x^k, the rows it holds,
and (from the active party's broadcast) latent samples h. Its outputs are the two contributions
it adds into the cross-party sums: the posterior terms and the log-likelihood terms.

The arithmetic after the networks lives in module-level functions that accept any leading axes, so
that `PartyStack` (several parties of one process evaluated as batched matrix products) runs
exactly the same formulas with a leading party axis.

Missing cells. A party may hold a row with some of its cells empty; `observed` ((B, d) bool, True
where a cell has a value) says which. Such a block is encoded with its empty cells imputed by 0
(the mean, after standardisation) and, with `cell_mask`, the missing-cell indicator (1 - observed) as
extra input of the encoder's first layer; its log-likelihood sums over the observed cells only (as
MIWAE does within one table). With `observed=None` every cell of a held row is observed and the
computation is exactly the one without the mask input: the indicator is then 0, so its term is
skipped, not added as zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..randomness import KeyStream, RecordNoise, SharedNoise
from .likelihood import CellLayout, cell_means, decoded_log_likelihood, read_decoder
from .mlp import mlp

MIN_PRECISION = 1e-3
Noise = KeyStream | RecordNoise | SharedNoise  # anything with KeyStream's `normal(shape, dtype, device)`


def impute_cells(x: Tensor, observed: Tensor | None) -> Tensor:
    """x with its unobserved cells set to 0 (mean imputation of standardised features): whatever a
    caller left there (NaN included) can change nothing."""
    return x if observed is None else torch.where(observed, x, torch.zeros_like(x))


def posterior_terms(encoded: Tensor, held: Tensor) -> Tensor:
    """[mu_k, precision_k] from the encoder output (..., B, 2 d_h) for the rows held ((..., B) bool)
    and exact zeros elsewhere.

    Zeros (not NaN-prone multiplications) so that the values of rows the party does not hold
    cannot change the sum: `torch.where` also blocks their gradients.
    """
    mean, raw_precision = encoded.chunk(2, dim=-1)
    # contiguous: on a strided half, softplus takes a slow path (model/active.py _gaussian_head)
    contribution = torch.cat([mean, F.softplus(raw_precision.contiguous()) + MIN_PRECISION], dim=-1)
    return torch.where(held.unsqueeze(-1), contribution, torch.zeros_like(contribution))


def likelihood_terms(first: Tensor, std: Tensor, x: Tensor, held: Tensor,
                     indicator: Callable[[Tensor], Tensor] | None = None, noise: Tensor | None = None,
                     observed: Tensor | None = None, layout: CellLayout | None = None) -> Tensor:
    """One party's term of the summed log-likelihood, (..., S, B), from the decoder's (first, std)
    (`likelihood.read_decoder`; `layout` None: every cell Gaussian, N(first, std^2), both (..., S, B, d)), its block x
    (..., B, d), held rows (..., B) and observed cells (..., B, d) (None: every cell of a held row).

    FALSE-VFL-I: log p(x^k_obs | h_j), summed over the observed cells of held rows; 0 elsewhere.
    FALSE-VFL-II (`indicator` given): plus log p(m^k | x^k) on every row, where m^k says whether the
    party holds the row (the block, not its cells) and every value the party lacks (a row it does not
    hold, an unobserved cell of one it does) is x^k_j = mean + std * noise, a reparameterised draw from
    its own decoder (a binary or categorical cell: its probabilities, `cell_means`).
    """
    x_s, held_s = impute_cells(x, observed).unsqueeze(-3), held.unsqueeze(-2)  # broadcast over the S samples
    observed_s = None if observed is None else observed.unsqueeze(-3)
    log_lik = decoded_log_likelihood(layout, x_s, observed_s, first, std)
    present = held_s.unsqueeze(-1) if observed is None else held_s.unsqueeze(-1) & observed_s
    term = torch.where(held_s, log_lik, torch.zeros_like(log_lik))
    if indicator is None:
        return term
    imputed = cell_means(layout, first, std, noise)
    x_full = torch.where(present, x_s.expand_as(imputed), imputed)
    logit = indicator(x_full).squeeze(-1)
    # m = 1 means "missing": log p(m=1|x) = log sigmoid(logit), log p(m=0|x) = log sigmoid(-logit).
    return term + F.logsigmoid(torch.where(held_s, -logit, logit))


class CellMask(nn.Module):
    """The missing-cell indicator's bias-free weight (hidden, d) into the encoder's first layer, zero at the
    start (see `PartyModel`); a module of its own so DP-SGD finds its per-row gradients (model.private_sgd)."""

    def __init__(self, n_features: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden, n_features))

    def forward(self, missing: Tensor) -> Tensor:
        return F.linear(missing, self.weight)


class PartyModel(nn.Module):
    """Encoder q(h | x^k) -> (mu_k, precision_k), decoder p(x^k | h) (per cell kind: `layout`,
    model/likelihood.py; every cell Gaussian without one) and, for
    FALSE-VFL-II, the missing indicator p(m^k | x^k) (Bernoulli).

    With `cell_mask`, the encoder's first layer also takes the missing-cell indicator, through
    `cell_mask` (its `weight`, (hidden, d)), a bias-free weight added to that layer. It starts at zero, not drawn: a
    model that never met an empty cell in training then encodes one exactly as mean imputation does,
    instead of through untrained random weights; every weight an inversion of the encoder needs is still
    drawn from the party's secret (`initialise`, which draws the layers above in the order it always did).
    """

    def __init__(
        self,
        n_features: int,
        h_dim: int,
        hidden: int,
        variant: str = "I",
        min_decoder_std: float = 0.05,
        indicator_hidden: int = 64,
        cell_mask: bool = False,
        layout: CellLayout | None = None,
        unit_precision: bool = False,
    ) -> None:
        super().__init__()
        if layout is not None and layout.width != n_features:
            raise ValueError(f"PartyModel: a cell layout of {layout.width} cells for a block of {n_features}")
        self.layout = None if layout is None or layout.all_gaussian else layout
        self.n_features = n_features
        self.h_dim = h_dim
        self.variant = variant
        self.min_decoder_std = min_decoder_std
        self.unit_precision = unit_precision  # under DP: only the means travel, every party's precision is 1
        self.encoder = mlp([n_features, hidden, 2 * h_dim])
        self.decoder = mlp([h_dim, hidden, 2 * n_features if self.layout is None else self.layout.decoder_width])
        self.indicator = (
            mlp([n_features, indicator_hidden, indicator_hidden, 1]) if variant == "II" else None
        )
        self.cell_mask = CellMask(n_features, hidden) if cell_mask else None

    @property
    def cell_weight(self) -> Tensor | None:
        return None if self.cell_mask is None else self.cell_mask.weight

    # -- generative-side parameters are everything here: stage 2 freezes the whole party model --

    def encode(self, x: Tensor, observed: Tensor | None = None) -> Tensor:
        """The encoder's output (B, 2 d_h) for a block with unobserved cells imputed and, with
        `cell_mask`, their indicator as extra input; `observed=None`: exactly `self.encoder(x)`."""
        if observed is None:
            return self.encoder(x)
        first = self.encoder[0](impute_cells(x, observed))
        if self.cell_mask is not None:
            first = first + self.cell_mask((~observed).to(x.dtype))
        return self.encoder[1:](first)

    def posterior_contribution(self, x: Tensor, held: Tensor, observed: Tensor | None = None) -> Tensor:
        """[mu_k, precision_k] for the rows this party holds and exact zeros elsewhere, (B, 2 d_h); with
        `unit_precision` [mu_k, 0]: the active party takes each holder's precision as 1 (`ActiveModel`)."""
        terms = posterior_terms(self.encode(x, observed), held)
        if self.unit_precision:
            return torch.cat([terms[..., :self.h_dim], torch.zeros_like(terms[..., self.h_dim:])], dim=-1)
        return terms

    def decode(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(first, std) of p(x^k | h): every cell's mean or logits and the Gaussian cells' std (`read_decoder`)."""
        return read_decoder(self.layout, self.decoder(h), self.min_decoder_std)

    def log_likelihood_contribution(self, h: Tensor, x: Tensor, held: Tensor, noise: Noise | None = None,
                                    observed: Tensor | None = None) -> Tensor:
        """This party's term of the summed log-likelihood, shape (kappa, B) (see `likelihood_terms`);
        FALSE-VFL-II draws the imputation noise from this party's own secret `noise`."""
        mean, std = self.decode(h)
        draws = None
        if self.indicator is not None:
            draws = noise.normal(tuple(mean.shape), mean.dtype, mean.device)
        return likelihood_terms(mean, std, x, held, self.indicator, draws, observed, self.layout)
