"""DP-SGD of a party's own networks: each row's gradient clipped, their sum noised, in the party's process.

A party's parameters are trained on its own rows, so every later release about another row depends on this
row through them; DP-SGD makes each step's update differentially private per row, so later releases are
post-processing of it (README "Output privacy"). Per-row gradients come from Opacus' hooks
(`GradSampleModule`) on the party's encoder (rows first), decoder and FALSE-VFL-II's indicator (samples
first: their inputs are (S, B, .)). Each row's gradient over all of the party's parameters is clipped to
L2 norm `clip`, the clipped gradients are summed on a fine grid (2^-24), and discrete Gaussian noise of
standard deviation `multiplier` x `clip` is added from the party's own secret stream; the optimiser then
takes the noised mean. No subsampling amplification is claimed: the batch order is public.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor, nn

from ..randomness import KeyStream
from ..secure.discrete_gaussian import discrete_gaussian
from .party import CellMask

GRADIENT_GRID = 2**24


def _register_cell_mask() -> None:
    """Opacus' per-row gradient of the missing-cell weight: each row's backprop times its indicator."""
    from opacus.grad_sample import register_grad_sampler

    @register_grad_sampler(CellMask)
    def cell_mask_rows(layer: CellMask, activations: list[Tensor], backprops: Tensor) -> dict:
        return {layer.weight: torch.einsum("n...i,n...j->nij", backprops, activations[0])}


class PrivateGradients:
    """The DP-SGD of one party model: `privatize` after the backward pass and before the optimiser step."""

    def __init__(self, model: nn.Module, clip: float, multiplier: float, stream: KeyStream) -> None:
        from opacus.grad_sample import GradSampleModule

        _register_cell_mask()
        parts = [(model.encoder, True), (model.decoder, False)]
        parts += [(m, first) for m, first in ((model.indicator, False), (model.cell_mask, True)) if m is not None]
        # Opacus' hooks fire on modules whose inputs need no gradient (the encoder's data): expected here.
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus warns about secure RNG: the noise here is ours, not its
            self.hooks = [GradSampleModule(m, batch_first=first, loss_reduction="sum") for m, first in parts]
        self.params = [p for m, _ in parts for p in m.parameters()]
        covered = {id(p) for p in self.params}
        uncovered = [name for name, p in model.named_parameters() if id(p) not in covered]
        if uncovered:
            raise ValueError(f"DP-SGD has no per-row gradient for {uncovered} (use cell_handling = \"mean\")")
        self.clip, self.multiplier, self.stream = clip, multiplier, stream

    def privatize(self) -> None:
        """Replace each parameter's gradient by the noised mean of the rows' clipped gradients."""
        samples = [p.grad_sample for p in self.params if getattr(p, "grad_sample", None) is not None]
        if not samples:
            return  # nothing trained this step (stage 2 freezes the party model)
        rows = samples[0].shape[0]
        flat = torch.cat([(s.detach().double() * rows).reshape(rows, -1) for s in samples], dim=1)
        limit = max(self.clip - math.sqrt(flat.shape[1]) / (2 * GRADIENT_GRID), 0.0)  # within clip on the grid
        scale = (limit / flat.norm(dim=1).clamp(min=1e-300)).clamp(max=1.0)
        total = torch.round((flat * scale.unsqueeze(1)).sum(0) * GRADIENT_GRID).to(torch.int64)
        variance = math.ceil((self.multiplier * self.clip * GRADIENT_GRID) ** 2)
        noise = torch.from_numpy(discrete_gaussian(variance, total.numel(), self.stream))
        noised = (total + noise).double() / GRADIENT_GRID / rows
        self._assign(noised)

    def _assign(self, noised: Tensor) -> None:
        start = 0
        for p in self.params:
            sample = getattr(p, "grad_sample", None)
            if sample is None:
                continue
            size = p.numel()
            p.grad = noised[start:start + size].reshape(p.shape).to(p.dtype)
            start += size
            p.grad_sample = None
