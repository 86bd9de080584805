"""DP-SGD of a party's own networks: each row's gradient clipped, their sum noised, in the party's process.

A party's parameters are trained on its own rows, so every later release about another row depends on this
row through them; DP-SGD makes each step's update differentially private per row, so later releases are
post-processing of it (README "Output privacy"). Every parameter of a party model is a linear map's (its
`nn.Linear` layers and the `CellMask` weight), so no row's gradient is ever materialised ("ghost clipping"):
hooks keep each layer's input A and the gradient G at its output, shaped (T, B, .) with T the samples (the
decoder's and FALSE-VFL-II's indicator's inputs are (S, B, .)) or 1 (the encoder's, rows first). Row i's
weight gradient is sum_t G[t,i]^T A[t,i], whose squared norm is sum_{t,u} (G[t,i].G[u,i]) (A[t,i].A[u,i]);
its bias gradient sum_t G[t,i]. Each row's gradient over all of the party's parameters is clipped to L2 norm
`clip` by a factor c_i, the clipped sum is sum_t (c G[t])^T A[t], put on a fine grid (2^-24), and discrete
Gaussian noise of standard deviation `multiplier` x `clip` is added from the party's own secret stream; the
optimiser then takes the noised mean. No subsampling amplification is claimed: the batch order is public.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..randomness import KeyStream
from ..secure.discrete_gaussian import discrete_gaussian
from .party import CellMask

GRADIENT_GRID = 2**24


class _Layer:
    """One linear map's hooks: the (T, B, in) inputs and (T, B, out) output gradients of this step's calls."""

    def __init__(self, module: nn.Module, rows_first: bool) -> None:
        self.module, self.rows_first, self.calls = module, rows_first, []
        module.register_forward_hook(self._forward)

    def _forward(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        if not (torch.is_grad_enabled() and output.requires_grad):
            return  # stage 2 and predictions: nothing to train
        call = [self._shaped(inputs[0].detach()), None]
        self.calls.append(call)
        output.register_hook(lambda grad: call.__setitem__(1, self._shaped(grad.detach())))

    def _shaped(self, t: Tensor) -> Tensor:
        """(T, B, d): rows-first inputs (B, d) as T = 1; samples-first (S, B, d) as they are."""
        t = t.unsqueeze(0) if self.rows_first else t
        return t.reshape(-1, *t.shape[-2:]).double()

    def take(self) -> tuple[Tensor, Tensor] | None:
        """This step's (A, G), the calls stacked along T; None where the layer had no gradient."""
        done = [(a, g) for a, g in self.calls if g is not None]
        self.calls = []
        if not done:
            return None
        if len({a.shape[1] for a, _ in done}) > 1:
            raise RuntimeError("DP-SGD: one layer's calls in a step disagree on the batch size")
        if len(done) == 1:
            return done[0][0], done[0][1]  # the usual step: one call, no copy
        return torch.cat([a for a, _ in done]), torch.cat([g for _, g in done])

    @property
    def bias(self) -> Tensor | None:
        return getattr(self.module, "bias", None)


def _row_sq_norms(a: Tensor, g: Tensor, with_bias: bool) -> Tensor:
    """(B,): each row's squared norm of its weight (and bias) gradient, from the Gram matrices over T."""
    if a.shape[0] == 1:
        norms = g[0].square().sum(1) * a[0].square().sum(1)
    else:
        norms = (torch.einsum("tbo,ubo->btu", g, g) * torch.einsum("tbi,ubi->btu", a, a)).sum((1, 2))
    return norms + (g.sum(0).square().sum(1) if with_bias else 0)


class PrivateGradients:
    """The DP-SGD of one party model: `privatize` after the backward pass and before the optimiser step."""

    def __init__(self, model: nn.Module, clip: float, multiplier: float, stream: KeyStream) -> None:
        parts = [(model.encoder, True), (model.decoder, False)]
        parts += [(m, first) for m, first in ((model.indicator, False), (model.cell_mask, True)) if m is not None]
        self.layers = [_Layer(layer, first) for part, first in parts for layer in part.modules()
                       if isinstance(layer, nn.Linear | CellMask)]
        self.params = [p for layer in self.layers for p in (layer.module.weight, layer.bias) if p is not None]
        covered = {id(p) for p in self.params}
        uncovered = [name for name, p in model.named_parameters() if id(p) not in covered]
        if uncovered:
            raise ValueError(f"DP-SGD has no per-row gradient for {uncovered} (use cell_handling = \"mean\")")
        self.clip, self.multiplier, self.stream = clip, multiplier, stream
        self.seen: list[Tensor] | None = None  # a list: each step's row norms are kept there (clip_proposal.py)

    def reset(self) -> None:
        """Forget what the hooks kept: a step that was abandoned (a party left) or a probe never updates, and
        its records must not join the next step's rows (a row would then count twice in one clip)."""
        for layer in self.layers:
            layer.calls = []

    def privatize(self) -> None:
        """Replace each parameter's gradient by the noised mean of the rows' clipped gradients."""
        taken = [(layer, layer.take()) for layer in self.layers]
        taken = [(layer, ag) for layer, ag in taken if ag is not None]
        if not taken:
            return  # nothing trained this step (stage 2 freezes the party model)
        rows = taken[0][1][0].shape[1]
        if any(a.shape[1] != rows for _, (a, _) in taken):
            raise RuntimeError("DP-SGD: the party's layers disagree on the step's batch size")
        norms = sum(_row_sq_norms(a, g, layer.bias is not None) for layer, (a, g) in taken).sqrt() * rows
        if self.seen is not None:
            self.seen.append(norms.detach().cpu())
        width = sum(p.numel() for layer, _ in taken for p in (layer.module.weight, layer.bias) if p is not None)
        # the rounded sum moves by at most |a_j| + 1 grid step per value when a row's a is added: sqrt(width) steps
        limit = max(self.clip - math.sqrt(width) / GRADIENT_GRID, 0.0)
        scale = (limit / norms.clamp(min=1e-300)).clamp(max=1.0) * rows
        sums = []
        for layer, (a, g) in taken:
            weighted = g * scale.view(1, -1, 1)
            flat = weighted.reshape(-1, weighted.shape[-1])  # sum_t (c G[t])^T A[t] as one product (einsum: 2x slower)
            sums.append((flat.T @ a.reshape(-1, a.shape[-1])).reshape(-1))
            sums += [weighted.sum((0, 1))] if layer.bias is not None else []
        total = torch.round(torch.cat(sums) * GRADIENT_GRID).to(torch.int64)
        variance = math.ceil((self.multiplier * self.clip * GRADIENT_GRID) ** 2)
        noise = torch.from_numpy(discrete_gaussian(variance, total.numel(), self.stream)).to(total.device)
        self._assign(taken, (total + noise).double() / GRADIENT_GRID / rows)

    @staticmethod
    def _assign(taken: list, noised: Tensor) -> None:
        start = 0
        for layer, _ in taken:
            for p in (layer.module.weight, layer.bias):
                if p is not None:
                    p.grad = noised[start:start + p.numel()].reshape(p.shape).to(p.dtype)
                    start += p.numel()
