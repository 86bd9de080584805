"""Several parties hosted by one process, evaluated together: the local runtime's fast path.

The local runtime simulates every party in one process. Calling K small networks one after the
other wastes the machine (K kernel launches per layer on a GPU, K thin products on a CPU), so here
the K same-shaped party networks run as one batched matrix product per layer (`torch.baddbmm` over
a leading party axis). The formulas after the networks are the ones `PartyModel` uses
(`posterior_terms`, `likelihood.read_decoder`, `likelihood_terms`), applied with that leading axis.

What stays separate: each party owns its parameters (its own optimiser and checkpoint). The
weights are stacked afresh in every call and `torch.stack` is differentiable, so the gradients
land in each party's own `.grad`. Batch entry k of every product touches party k's weights and
party k's data only, and the results are handed to the transport as one contribution per party,
so nothing crosses a party boundary that the sequential path would not send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from .likelihood import read_decoder
from .party import Noise, PartyModel, impute_cells, likelihood_terms, posterior_terms


def stacked_mlp(mlps: Sequence[nn.Sequential], x: Tensor) -> Tensor:
    """Apply K MLPs of identical shape to x of shape (K, N, d_in), entry k through MLP k: (K, N, d_out)."""
    for layers in zip(*mlps, strict=True):
        if isinstance(layers[0], nn.Linear):
            weight = torch.stack([layer.weight for layer in layers])  # (K, out, in)
            bias = torch.stack([layer.bias for layer in layers])  # (K, out)
            x = torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
        elif isinstance(layers[0], nn.ReLU):
            x = torch.relu(x)
        else:
            raise TypeError(f"stacked_mlp: no batched rule for {type(layers[0]).__name__}")
    return x


def _signature(model: PartyModel) -> tuple:
    shapes = tuple((name, tuple(p.shape)) for name, p in model.named_parameters())
    return shapes, model.variant, model.min_decoder_std, model.cell_weight is not None, model.layout


class PartyStack:
    """The hosted parties' networks as batched products; contributions come back per party."""

    def __init__(self, parties: Mapping[int, PartyModel]) -> None:
        if not self.can_stack(parties):
            raise ValueError("PartyStack needs at least two parties with identically shaped models")
        self.parties = dict(sorted(parties.items()))
        first = next(iter(self.parties.values()))
        self.min_decoder_std = first.min_decoder_std
        self.has_indicator = first.indicator is not None
        self.has_cell_mask = first.cell_weight is not None
        self.layout = first.layout

    @staticmethod
    def can_stack(parties: Mapping[int, PartyModel]) -> bool:
        """True when there are several parties and their models have the same shapes (equal block
        widths): the condition for one batched product per layer."""
        return len(parties) > 1 and len({_signature(m) for m in parties.values()}) == 1

    def _stack(self, values: Mapping[int, Tensor]) -> Tensor:
        return torch.stack([values[k] for k in self.parties])

    def _per_party(self, stacked: Tensor) -> dict[int, Tensor]:
        return dict(zip(self.parties, stacked.unbind(0), strict=True))

    def _cells(self, observed: Mapping[int, Tensor], x: Mapping[int, Tensor]) -> Tensor | None:
        """The stacked observed-cell masks (K, B, d); a party without one observes every cell (its
        indicator is 0). None when no hosted party has one: then nothing of the cell path runs."""
        if not any(k in observed for k in self.parties):
            return None
        return torch.stack([observed[k] if k in observed else torch.ones_like(x[k], dtype=torch.bool)
                            for k in self.parties])

    def _encode(self, xs: Tensor, cells: Tensor | None, observed: Mapping[int, Tensor]) -> Tensor:
        """`PartyModel.encode` of every party at once. A party without a cell mask gets its cell weight
        detached (its indicator is 0, so values are unchanged): no gradient, as in its own `encode`."""
        encoders = [m.encoder for m in self.parties.values()]
        if cells is None:
            return stacked_mlp(encoders, xs)
        first = stacked_mlp([e[:1] for e in encoders], impute_cells(xs, cells))
        if self.has_cell_mask:
            weight = torch.stack([m.cell_weight if k in observed else m.cell_weight.detach()
                                  for k, m in self.parties.items()])
            first = torch.baddbmm(first, (~cells).to(xs.dtype), weight.transpose(1, 2))
        return stacked_mlp([e[1:] for e in encoders], first)

    def posterior_contributions(self, x: Mapping[int, Tensor], held: Mapping[int, Tensor],
                                observed: Mapping[int, Tensor] | None = None) -> dict[int, Tensor]:
        """Every hosted party's `posterior_contribution`, (B, 2 d_h) each; `observed` holds the cell
        masks of the parties that have one."""
        observed = observed or {}
        encoded = self._encode(self._stack(x), self._cells(observed, x), observed)
        return self._per_party(posterior_terms(encoded, self._stack(held)))

    def log_likelihood_contributions(self, h: Mapping[int, Tensor], x: Mapping[int, Tensor],
                                     held: Mapping[int, Tensor], noises: Mapping[int, Noise],
                                     observed: Mapping[int, Tensor] | None = None) -> dict[int, Tensor]:
        """Every hosted party's `log_likelihood_contribution` for its copy of the latent samples
        h[k] (S, B, d_h), (S, B) each; FALSE-VFL-II draws each party's imputation noise from that
        party's own secret stream, the same numbers the sequential path draws."""
        hs = self._stack(h)
        n_parties, n_samples, batch, _ = hs.shape

        def per_sample(mlps: list[nn.Sequential], inputs: Tensor) -> Tensor:
            out = stacked_mlp(mlps, inputs.reshape(n_parties, n_samples * batch, inputs.shape[-1]))
            return out.reshape(n_parties, n_samples, batch, out.shape[-1])

        mean, std = read_decoder(self.layout, per_sample([m.decoder for m in self.parties.values()], hs),
                                 self.min_decoder_std)
        indicator = noise = None
        if self.has_indicator:
            noise = torch.stack([noises[k].normal(tuple(mean.shape[1:]), mean.dtype, mean.device)
                                 for k in self.parties])

            def indicator(values: Tensor) -> Tensor:
                return per_sample([m.indicator for m in self.parties.values()], values)

        cells = self._cells(observed or {}, x)
        return self._per_party(likelihood_terms(mean, std, self._stack(x), self._stack(held), indicator, noise, cells,
                                                self.layout))
