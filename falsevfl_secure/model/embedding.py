"""The networks of the baselines (paper, App. D.1): each party's feature extractor with the SimSiam heads
of its pretraining, FedHSSL's hybrid party (a cross-party encoder beside a local bottom and top encoder),
and the active party's fusion head (the "discriminator", a 2-layer MLP on the fused embeddings).

A party's module sees its own block only; what leaves it is an embedding, which the method sums across
parties through the transport (`methods/`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..bounds import diagonal_gaussian_log_prob
from ..errors import InputError
from .mlp import mlp
from .ssl import SimSiamHeads, simsiam_loss


class _Ranged(nn.Module):
    """A party module that keeps its features' training range (the augmentation draws from it)."""

    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.n_features = n_features
        self.register_buffer("low", torch.zeros(n_features))
        self.register_buffer("high", torch.zeros(n_features))

    def set_range(self, low: Tensor, high: Tensor) -> None:
        self.low.copy_(low)
        self.high.copy_(high)


class EmbeddingParty(_Ranged):
    """Vanilla VFL, LASER-VFL and PlugVFL at one party: a 3-layer MLP extractor x^k -> e^k (`width` wide),
    and the SimSiam heads of its local pretraining (unused after it)."""

    def __init__(self, n_features: int, width: int, hidden: int) -> None:
        super().__init__(n_features)
        self.width = width
        self.extractor = mlp([n_features, hidden, hidden, width])
        self.heads = SimSiamHeads(width)

    def embed(self, x: Tensor) -> Tensor:
        return self.extractor(x)

    def ssl_loss(self, view1: Tensor, view2: Tensor) -> Tensor:
        return simsiam_loss(self.embed, self.heads, view1, view2)


class HybridParty(_Ranged):
    """FedHSSL at one party: a cross-party encoder (2-layer MLP), trained by cross-party SimSiam on aligned
    rows, beside a local encoder (a 1-layer bottom and a 1-layer top), trained by local SimSiam on every
    row the party holds; the local top encoder and the local heads are averaged across parties (`shared`).
    Its fine-tuning embedding is both encoders' outputs side by side (2 x `width`)."""

    def __init__(self, n_features: int, width: int, hidden: int) -> None:
        super().__init__(n_features)
        self.width = 2 * width
        self.cross = mlp([n_features, hidden, width])
        self.bottom = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU())
        self.top = mlp([hidden, width])
        self.cross_heads = SimSiamHeads(width)
        self.local_heads = SimSiamHeads(width)

    def local(self, x: Tensor) -> Tensor:
        return self.top(self.bottom(x))

    def embed(self, x: Tensor) -> Tensor:
        return torch.cat([self.cross(x), self.local(x)], dim=-1)

    def ssl_loss(self, view1: Tensor, view2: Tensor) -> Tensor:
        return simsiam_loss(self.local, self.local_heads, view1, view2)

    def shared(self) -> list[nn.Parameter]:
        """The parameters FedHSSL's partial model aggregation averages: local top encoder and local heads."""
        return [*self.top.parameters(), *self.local_heads.parameters()]


class FusionHead(nn.Module):
    """The active party's fusion model: a 2-layer MLP from the fused embedding to the label's distribution
    (class logits; for regression a mean with unit variance)."""

    def __init__(self, width: int, hidden: int, n_classes: int, task: str = "classification") -> None:
        super().__init__()
        self.task, self.n_classes = task, n_classes
        self.discriminator = mlp([width, hidden, n_classes if task == "classification" else 1])

    def log_prob(self, fused: Tensor, y: Tensor) -> Tensor:
        """log p(y | fused) per row (any leading axes before the batch's)."""
        out = self.discriminator(fused)
        if self.task == "classification":
            if y.dtype not in (torch.int64, torch.int32) or (
                y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.n_classes)
            ):
                raise InputError(f"labels must be integers in 0..{self.n_classes - 1}")
            index = y.reshape(*([1] * (out.dim() - 2)), -1, 1).expand(*out.shape[:-1], 1)
            return out.log_softmax(-1).gather(-1, index).squeeze(-1)
        target = y.to(out.dtype).reshape(*([1] * (out.dim() - 2)), -1, 1)
        return diagonal_gaussian_log_prob(target.expand_as(out), out, torch.ones_like(out))

    def predict(self, fused: Tensor) -> Tensor:
        """Class probabilities (B, C), or the predicted means (B,) for regression."""
        out = self.discriminator(fused)
        return out.softmax(-1) if self.task == "classification" else out.squeeze(-1)
