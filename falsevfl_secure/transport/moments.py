"""The latent gradient in two sample moments: exact, and S/2 times smaller than the samples' gradient.

The active party broadcasts reparameterised samples h_s = mu + sigma * eps_s (S, B, H) and needs back
only the gradient of the loss w.r.t. mu and sigma: sum_s g_s and sum_s g_s * eps_s, where g_s is the
parties' summed gradient w.r.t. h_s. A party does not know eps, but every receiver holds the same h, so
it returns the two moments

    A = sum_s g_s,    C = sum_s g_s * (h_s - hbar),    hbar = mean_s h_s        (2, B, H)

(centred on hbar, which every receiver computes alike, so that C carries no large cancelling terms).
Both are linear in g, so the parties' moments sum like their gradients. From the summed moments the
active party rebuilds a surrogate gradient ghat (S, B, H) that is not g but has the same two moments:

    ghat_s = A / S + (h_s - hbar) * C / D,    D = sum_s (h_s - hbar)^2

(sum_s ghat_s = A since the centred h sum to zero, sum_s ghat_s (h_s - hbar) = C), and any function of
h = mu + sigma * eps gets the exact gradient from it: d/dmu = sum_s ghat_s = A and
d/dsigma = sum_s ghat_s eps_s = (C + (hbar - mu) A) / sigma. Where D = 0 (S = 1, or the S samples of an
entry coincide) C = 0 as well and ghat_s = A / S is exact. The active party learns (A, C), a linear
function of the sum of gradients it received before, so strictly less.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sample_moments(grad: Tensor, h: Tensor) -> Tensor:
    """(2, B, H): [sum_s grad_s, sum_s grad_s * (h_s - mean_s h_s)] of a gradient w.r.t. samples h (S, B, H)."""
    centred = h - h.mean(dim=0, keepdim=True)
    return torch.stack((grad.sum(dim=0), (grad * centred).sum(dim=0)))


def gradient_from_moments(moments: Tensor, h: Tensor) -> Tensor:
    """(S, B, H): a gradient w.r.t. h whose `sample_moments` are `moments` (the module docstring's ghat)."""
    first, centred_moment = moments.to(h.dtype).unbind(0)
    centred = h - h.mean(dim=0, keepdim=True)
    spread = (centred * centred).sum(dim=0)
    slope = torch.where(spread > 0, centred_moment / torch.where(spread > 0, spread, 1.0), 0.0)
    return first / h.shape[0] + centred * slope
