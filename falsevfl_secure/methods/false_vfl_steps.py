"""One FALSE-VFL step, written once for every runtime.

`forward_rounds` is the protocol: the `posterior` sum, the `latent` broadcast (or, in the measured
`moments` variant, `latent_moments`), the `likelihood` sum.
Stage 1 then runs their adjoints through the transport's backward. Code inside a party only touches
that party's batch entries; the only values that cross a party boundary are the arguments of
`transport.aggregate` and `transport.broadcast`, and what only the active party holds is `Active`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..bounds import conditional_bound, diagonal_gaussian_log_prob, iwae_bound, snis_predict
from ..config import Stage
from ..errors import InputError, ProtocolError
from ..model.active import own_features
from ..model.trees import head_features
from ..node import ActiveRole, Batch, Node
from ..placement import Active, apply
from ..randomness import RowNoise
from ..transport.rounds import LATENT, LATENT_MOMENTS, LIKELIHOOD, POSTERIOR


def _check_block(k: int, n_features: int, batch: Batch) -> int:
    """Party k's block, held rows and cell mask in the batch; its batch size."""
    if k not in batch.x or k not in batch.held:
        raise InputError(f"party {k}: the batch has no feature block for it")
    x, held, observed = batch.x[k], batch.held[k], batch.observed.get(k)
    if x.dim() != 2 or x.shape[1] != n_features:
        raise InputError(f"party {k}: expected a (B, {n_features}) feature block, got {tuple(x.shape)}")
    if held.dtype != torch.bool or held.shape != x.shape[:1]:
        raise InputError(f"party {k}: the held-rows mask must be bool of shape ({x.shape[0]},), "
                         f"got {held.dtype} {tuple(held.shape)}")
    if observed is not None and (observed.dtype != torch.bool or observed.shape != x.shape):
        raise InputError(f"party {k}: the observed-cell mask must be bool of shape {tuple(x.shape)}, "
                         f"got {observed.dtype} {tuple(observed.shape)}")
    return x.shape[0]


def check_batch(node: Node, batch: Batch) -> None:
    """Refuse a batch the networks would choke on, with a message that says what is wrong."""
    sizes = {_check_block(k, role.model.n_features, batch) for k, role in node.parties.items()}
    if batch.record_keys is not None:
        if batch.record_keys.ndim != 2 or batch.record_keys.shape[1] != 32:
            raise InputError(f"the batch's record keys must be (B, 32), got {tuple(batch.record_keys.shape)}")
        sizes.add(batch.record_keys.shape[0])
    if batch.n_observed.present:
        n_observed = batch.n_observed.get()
        sizes.add(n_observed.shape[0] if n_observed.dim() == 1 else -1)
        if n_observed.numel() and float(n_observed.min()) < (0 if batch.orphans else 1):
            raise InputError("a sample in the batch has no observed party; it cannot reach the model")
    if len(sizes) > 1:
        raise InputError(f"the parties' batch blocks disagree on the batch size: {sorted(sizes)}")
    if sizes == {0}:
        raise InputError("empty batch: no samples to process")


def encoded_count(node: Node, batch: Batch) -> Active[Tensor]:
    """The number of parties in each row's posterior: those holding it, or with `encode_missing = "zeros"`
    every party (a row no party holds any more stays at 0: `_orphans_from_prior`)."""
    if not node.method.encodes_missing_blocks:
        return batch.n_observed
    return batch.n_observed.map(lambda n: torch.where(n > 0, node.cfg.parties, 0).to(n.dtype))


class Weighted(NamedTuple):
    """What the forward rounds leave at the active party: the log importance weights (S, B), the latent
    samples (S, B, d_h) and the posterior mean (B, d_h) they were drawn around (computed from the sum it holds)."""

    log_w: Tensor
    h: Tensor
    loc: Tensor


def _sample(role: ActiveRole, noise, posterior: Tensor, n_observed: Tensor, n_samples: int):
    posterior, n_observed = _orphans_from_prior(posterior, n_observed)
    h, log_q = role.model.sample_latent(posterior, n_observed, n_samples, noise)
    return h, log_q, role.model.latent_moments(posterior, n_observed)[0]


def _orphans_from_prior(posterior: Tensor, n_observed: Tensor) -> tuple[Tensor, Tensor]:
    """Rows no party holds any more (a party left the run): the standard normal as their posterior, so their
    samples are finite; their loss weight is 0 (`_row_mean`). Other rows are untouched."""
    orphan = n_observed < 1
    if not bool(orphan.any()):
        return posterior, n_observed
    h_dim = posterior.shape[-1] // 2
    prior = torch.cat([posterior.new_zeros(h_dim), posterior.new_ones(h_dim)])
    return torch.where(orphan.unsqueeze(-1), prior, posterior), n_observed.clamp(min=1)


def _row_mean(values: Tensor, n_observed: Tensor) -> Tensor:
    """The batch mean over rows some party holds (every row, bit-identically, unless a party left)."""
    kept = n_observed > 0
    return values.mean() if bool(kept.all()) else values[kept].mean()


def _weigh(role: ActiveRole, latent: tuple[Tensor, Tensor, Tensor], likelihood: Tensor,
           terms: tuple[Tensor, Tensor, Tensor]) -> Weighted:
    h, log_q_h, loc = latent
    return Weighted(role.model.log_weights(log_q_h, likelihood, terms), h, loc.detach())


def forward_rounds(node: Node, batch: Batch, n_samples: int, stage: Stage) -> Active[Weighted]:
    """The three forward rounds; at the active party the log importance weights, the latent samples and the
    posterior mean (`Weighted`). The active party's latent and z draws come from one noise source per step,
    in that order (`ActiveRole.noise`)."""
    check_batch(node, batch)
    noise = node.active.map(lambda role: role.noise(stage, batch.record_keys))
    posterior = node.transport.aggregate(POSTERIOR, node.posterior_contributions(batch))
    if LATENT_MOMENTS in node.method.rounds.step(stage):
        latent, h = _broadcast_moments(node, noise, posterior, batch, n_samples)
    else:
        latent = apply(_sample, node.active, noise, posterior, encoded_count(node, batch), n_samples)
        h = node.transport.broadcast(LATENT, latent.map(lambda s: s[0]), (n_samples, batch.size, node.cfg.h_dim))
    # z and its terms read the samples only: drawn before the likelihood round, they overlap the parties' decoders,
    # and the round's adjoint (created later) runs first in the backward pass, before their gradients
    terms = apply(lambda role, n, sampled: role.model.global_terms(sampled[0], n), node.active, noise, latent)
    likelihood = node.transport.aggregate(LIKELIHOOD, node.likelihood_contributions(h, batch, stage))
    return apply(_weigh, node.active, latent, likelihood, terms)


# -- the moments variant of the latent broadcast (measured, not the default: README) --------------------

KEY_WORDS = 16  # a row's 32-byte sampling key as 16 uint16 words, each exact in float32


def _moments_payload(role: ActiveRole, noise, posterior: Tensor, n_observed: Tensor) -> Tensor:
    """(B, 2 d_h + 16): the posterior's mean and scale and a fresh sampling key per row (from the active
    party's noise: its stream in training, the row's record stream in a repeatable prediction)."""
    loc, scale = role.model.latent_moments(*_orphans_from_prior(posterior, n_observed))
    words = noise.row_keys(loc.shape[0]).view("<u2").astype(np.float32)
    return torch.cat([loc, scale, torch.from_numpy(words).to(loc)], dim=-1)


def _row_keys(words: Tensor) -> np.ndarray:
    """The (B, 32) uint8 row keys of a payload's key words; anything but 16-bit words is refused."""
    w = words.detach().to("cpu", torch.float64).numpy()
    if not ((w >= 0) & (w <= 0xFFFF) & (w == np.round(w))).all():
        raise ProtocolError("round 'latent_moments': field 'payload': the row keys are not 16-bit words")
    return w.astype("<u2").view(np.uint8).reshape(len(w), 2 * KEY_WORDS)


def moments_noise(payload: Tensor, n_samples: int, h_dim: int) -> Tensor:
    """(S, B, d_h) standard normal draws from each row's key of a moments payload."""
    words = payload[..., 2 * h_dim:]
    return RowNoise.from_keys(_row_keys(words)).normal((n_samples, payload.shape[0], h_dim), payload.dtype,
                                                       payload.device)


def samples_from_moments(payload: Tensor, n_samples: int, h_dim: int, eps: Tensor | None = None) -> Tensor:
    """(S, B, d_h) samples h = mean + scale * eps of a moments payload, eps drawn from each row's key (or
    `eps`, drawn from the same keys): every holder of the payload draws the same samples the active party does."""
    loc, scale, _ = payload.split([h_dim, h_dim, KEY_WORDS], dim=-1)
    return loc + scale * (moments_noise(payload, n_samples, h_dim) if eps is None else eps)


def _with_log_q(payload: Tensor, eps: Tensor, h_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    h = samples_from_moments(payload, eps.shape[0], h_dim, eps)
    loc, scale, _ = payload.split([h_dim, h_dim, KEY_WORDS], dim=-1)
    return h, diagonal_gaussian_log_prob(h, loc, scale), loc


def _broadcast_moments(node: Node, noise, posterior: Active[Tensor], batch: Batch, n_samples: int):
    """The `latent_moments` round: the active party broadcasts mean, scale and row keys; every party draws
    its samples from them (the gradients of mean and scale come back as the adjoint's sum). Every copy a
    process holds is the one broadcast frame, so its noise is drawn once per process."""
    h_dim = node.cfg.h_dim
    payload = apply(_moments_payload, node.active, noise, posterior, encoded_count(node, batch))
    received = node.transport.broadcast(LATENT_MOMENTS, payload, (batch.size, 2 * h_dim + KEY_WORDS))
    copies = [*([payload.get()] if node.active.present else []), *received.values()]
    if any(not torch.equal(c[:, 2 * h_dim:], copies[0][:, 2 * h_dim:]) for c in copies[1:]):
        raise ProtocolError("round 'latent_moments': field 'payload': copies of one broadcast differ in their keys")
    eps = moments_noise(copies[0], n_samples, h_dim)
    h = {k: samples_from_moments(v, n_samples, h_dim, eps) for k, v in received.items()}
    return payload.map(lambda p: _with_log_q(p, eps, h_dim)), h


def stage1_loss(node: Node, batch: Batch) -> Active[Tensor]:
    """Negative kappa-sample IWAE bound of log p(x_obs) (FALSE-VFL-II: of log p(x_obs, m)), batch mean."""
    weighted = forward_rounds(node, batch, node.cfg.kappa, Stage.PRETRAIN)
    return apply(lambda role, w, n: -_row_mean(iwae_bound(w.log_w), n), node.active, weighted, batch.n_observed)


def own_inputs(node: Node, batch: Batch, weighted: Active[Weighted]) -> Tensor | None:
    """The active party's own inputs to its discriminator (`discriminator_inputs` other than "latent"): its
    block, with "latent+mean+own" also the posterior mean it computed from the revealed sum, and its extra
    inputs (its own trees' score): values it holds in clear, never another party's; None for p(y | h)."""
    if not node.active.present or not node.active.get().model.own_inputs:
        return None
    a = node.cfg.active_index
    own = [own_features(batch.x[a], batch.held[a], node.cells(batch).get(a))]
    own += [weighted.get().loc.to(own[0])] if node.method.reads_posterior_mean else []
    own += [batch.own_extra.get().to(own[0])] if batch.own_extra.present else []
    return torch.cat(own, dim=-1)


def conditional_loss(role: ActiveRole, weighted: Weighted, y: Tensor, own: Tensor | None,
                      n_observed: Tensor) -> Tensor:
    log_w, h = weighted.log_w, weighted.h
    bound = conditional_bound(log_w, role.model.label_log_prob(h, y, own))
    if role.class_weights is None:
        return -_row_mean(bound, n_observed)
    weights = role.class_weights[y] * (n_observed > 0)  # "balanced": each class counts as much as the others
    return -(weights * bound).sum() / weights.sum().clamp(min=1e-12)


def stage2_loss(node: Node, batch: Batch) -> Active[Tensor]:
    """Negative conditional bound L'_kappa over the discriminator only: the forward rounds run without
    gradients (the generative part is frozen), so no backward round ever leaves the active party and no
    label-dependent value reaches a passive party."""
    with torch.no_grad():
        weighted = forward_rounds(node, batch, node.cfg.kappa, Stage.TRAIN)
    return apply(conditional_loss, node.active, weighted, batch.y, own_inputs(node, batch, weighted),
                 batch.n_observed)


def snis_output(role: ActiveRole, weighted: Weighted, own: Tensor | None = None) -> Tensor:
    """The SNIS prediction from the forward rounds' weights and samples: class probabilities (B, C), or
    (B,) predicted means for regression."""
    log_w, h = weighted.log_w, weighted.h
    out = role.model.label_distribution(h, own)
    if role.model.task == "classification":
        return snis_predict(log_w, out)
    return snis_predict(log_w, out[..., :1]).squeeze(-1)


def trees_inputs(node: Node, batch: Batch, weighted: Active[Weighted]) -> Active:
    """The inputs of the active party's trees (`head_features`): its own block where it observes it, the
    posterior mean it computed, the number of holders; all its own values."""
    if not node.active.present:
        return Active.absent()
    a = node.cfg.active_index
    cells = node.cells(batch).get(a)
    seen = batch.held[a].bool().unsqueeze(-1) & (torch.ones_like(batch.x[a], dtype=torch.bool) if cells is None
                                                 else cells.bool())
    return Active(head_features(batch.x[a], seen, weighted.get().loc, batch.n_observed.get(), own_groups(node)))


def own_groups(node: Node) -> tuple[tuple[int, int], ...]:
    """The one-hot cell groups of the active party's categorical columns (none where every cell is numeric)."""
    layout = node.parties[node.cfg.active_index].model.layout
    return layout.groups if layout is not None else ()


def head_output(role: ActiveRole, weighted: Weighted, own: Tensor | None, trees_input) -> Tensor:
    """The discriminator's SNIS output, blended with the trees' where the head has them."""
    out = snis_output(role, weighted, own)
    return out if role.trees is None else role.trees.blend(out, trees_input)


@torch.no_grad()
def predict(node: Node, batch: Batch) -> Active[Tensor]:
    """SNIS prediction with L = cfg.predict_samples: class probabilities (B, C) at the active party (for
    regression: (B,) predicted means); with `head = "network+trees"` blended with the trees'."""
    weighted = forward_rounds(node, batch, node.cfg.predict_samples, Stage.PREDICT)
    trees = node.active.present and node.active.get().trees is not None
    return apply(head_output, node.active, weighted, own_inputs(node, batch, weighted),
                 trees_inputs(node, batch, weighted) if trees else None)
