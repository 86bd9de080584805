"""The one MLP builder every network of the model uses."""

from __future__ import annotations

from torch import nn


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
