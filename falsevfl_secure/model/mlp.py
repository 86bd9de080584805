"""The one MLP builder every network of the model uses, and their initialisation from a secret stream."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..randomness import KeyStream


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (none after the last).

    `mlp([a, b, c])` is a 2-layer MLP a -> b -> c.
    """
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


@torch.no_grad()
def initialise(module: nn.Module, stream: KeyStream) -> nn.Module:
    """Draw every linear layer's weight and bias from `stream` with PyTorch's default distribution,
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)): the same model as `nn.Linear`'s own initialisation, but from the
    owning party's secret stream instead of torch's global generator (a party's weights are secret)."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            bound = 1.0 / math.sqrt(layer.in_features) if layer.in_features else 0.0
            layer.weight.copy_(stream.symmetric(tuple(layer.weight.shape), bound))
            layer.bias.copy_(stream.symmetric(tuple(layer.bias.shape), bound))
    return module
