"""SimSiam (Chen & He, 2021) on one party's own rows, as the paper pretrains every baseline's local model:
the projector and predictor heads, the symmetric negative-cosine loss with a stop-gradient, and FedHSSL's
tabular augmentation (He et al., 2024): in each row a random 30 % of the features are replaced by draws
from U[min, max] of that feature over the party's own training rows.

Every random number here (which features are replaced, the values drawn) comes from the owning party's
secret stream (`randomness.KeyStream`): a party's augmentations are as private as its weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..randomness import KeyStream

AUGMENT_FRACTION = 0.3  # FedHSSL's tabular transform: the share of a row's features replaced
# The fewest rows a SimSiam step takes (fewer: no step). Its heads' batch norm scales each feature by 1 / its
# spread over the batch. On 2 rows it outputs +-1 whatever its input, and its gradient is zero except where the
# two rows nearly coincide in a feature, where it reaches 1 / sqrt(eps), about 300. From 3 rows on the gradient
# scales as 1 / spread, and a feature's batch variance is chi-square with n - 1 degrees of freedom, so
# P(gradient > t) ~ t^-(n-1): an infinite variance on 3 rows, a finite one from 4. Measured on random heads
# (width 128, 300 batches), the largest gradient: 1.4e3 on 2 rows, 7 on 3, 0.9 on 4 (median 0.2). Under SGD
# momentum one such step blew an encoder's weights up 20-fold (FedHSSL's cross-party encoder on the 2 aligned
# rows of an epoch's last batch, Isolet under MNAR 0.7), and its stage 2 then stayed at chance.
MIN_ROWS = 4


def _block(n_in: int, n_out: int, relu: bool) -> list[nn.Module]:
    return [nn.Linear(n_in, n_out), nn.BatchNorm1d(n_out), *([nn.ReLU()] if relu else [])]


class SimSiamHeads(nn.Module):
    """SimSiam's projector (3-layer MLP with batch norm, `width` -> `width`) and predictor (2-layer MLP
    with a `width` / 4 bottleneck), on top of an extractor's `width`-wide embedding."""

    def __init__(self, width: int) -> None:
        super().__init__()
        bottleneck = max(width // 4, 1)
        self.projector = nn.Sequential(*_block(width, width, True), *_block(width, width, True),
                                       *_block(width, width, False))
        self.predictor = nn.Sequential(*_block(width, bottleneck, True), nn.Linear(bottleneck, width))

    def forward(self, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """(z, p): the projection and the prediction of an embedding (N, width)."""
        z = self.projector(embedding)
        return z, self.predictor(z)


def negative_cosine(p: Tensor, z: Tensor) -> Tensor:
    """Per row, -cos(p, z) with z's gradient stopped (SimSiam's D), shape (N,)."""
    return -(F.normalize(p, dim=-1) * F.normalize(z.detach(), dim=-1)).sum(-1)


def simsiam_loss(encode, heads: SimSiamHeads, view1: Tensor, view2: Tensor) -> Tensor:
    """The symmetric SimSiam loss of two views (N, d) of the same rows: (D(p1, z2) + D(p2, z1)) / 2, mean;
    a zero with no gradient (no step, no batch-norm statistics) on fewer than `MIN_ROWS` rows."""
    if view1.shape[0] < MIN_ROWS:
        return view1.new_zeros(())
    z1, p1 = heads(encode(view1))
    z2, p2 = heads(encode(view2))
    return 0.5 * (negative_cosine(p1, z2) + negative_cosine(p2, z1)).mean()


def augment(x: Tensor, low: Tensor, high: Tensor, stream: KeyStream, fraction: float = AUGMENT_FRACTION) -> Tensor:
    """`x` (N, d) with round(fraction * d) features of each row, chosen uniformly from the secret `stream`,
    replaced by uniform draws on [low, high] (per feature, from the same stream)."""
    n, d = x.shape
    replace = round(fraction * d)
    if n == 0 or replace == 0:
        return x
    order = stream.uniform(n * d).reshape(n, d).argsort(dim=1)
    chosen = torch.zeros(n, d, dtype=torch.bool).scatter_(1, order[:, :replace], True).to(x.device)
    draws = stream.uniform(n * d).reshape(n, d).to(device=x.device, dtype=x.dtype)
    return torch.where(chosen, low + (high - low) * draws, x)


def feature_range(x: Tensor, held: Tensor) -> tuple[Tensor, Tensor]:
    """Per feature, the min and max over the rows held (zeros where no row is held)."""
    rows = x[held]
    if rows.shape[0] == 0:
        zeros = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
        return zeros, zeros
    return rows.min(dim=0).values, rows.max(dim=0).values
