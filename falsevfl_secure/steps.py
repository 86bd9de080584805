"""One FALSE-VFL step, written once for every runtime.

Each function runs the forward rounds in order (`posterior`, `latent`, `likelihood`); stage 1
then runs their adjoints through the transport's backward. Code inside a party only touches that
party's batch entries; the only values that cross a party boundary are the arguments of
`transport.aggregate` and `transport.broadcast`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .bounds import conditional_bound, iwae_bound, snis_predict
from .errors import InputError
from .world import Batch, World


def check_batch(world: World, batch: Batch) -> None:
    """Refuse a batch that the networks would choke on, with a message that says what is wrong
    (instead of a shape error from inside torch)."""
    sizes = set()
    for k, party in world.parties.items():
        if k not in batch.x or k not in batch.held:
            raise InputError(f"party {k}: the batch has no feature block for it")
        x, held = batch.x[k], batch.held[k]
        if x.dim() != 2 or x.shape[1] != party.n_features:
            raise InputError(f"party {k}: expected a (B, {party.n_features}) feature block, got {tuple(x.shape)}")
        if held.dtype != torch.bool or held.shape != x.shape[:1]:
            raise InputError(f"party {k}: the held-rows mask must be bool of shape ({x.shape[0]},), "
                             f"got {held.dtype} {tuple(held.shape)}")
        sizes.add(x.shape[0])
    if world.hosts_active:
        if batch.n_observed is None or batch.n_observed.dim() != 1:
            raise InputError("the active party needs the number of observed parties per row")
        sizes.add(batch.n_observed.shape[0])
        if batch.n_observed.numel() and float(batch.n_observed.min()) < 1:
            raise InputError("a sample in the batch has no observed party; it cannot reach the model")
    if len(sizes) > 1:
        raise InputError(f"the parties' batch blocks disagree on the batch size: {sorted(sizes)}")
    if sizes == {0}:
        raise InputError("empty batch: no samples to process")


def forward_rounds(world: World, batch: Batch, n_samples: int) -> tuple[Tensor | None, Tensor | None]:
    """The three forward rounds. Returns (log importance weights (S, B), latent samples (S, B, d_h))
    at the active party, (None, None) elsewhere."""
    check_batch(world, batch)
    transport = world.transport
    sum_posterior = transport.aggregate("posterior", world.posterior_contributions(batch))

    h = log_q_h = None
    if world.hosts_active:
        h, log_q_h = world.active.sample_latent(sum_posterior, batch.n_observed, n_samples,
                                                world.active_generator)
    batch_size = next(iter(batch.held.values())).shape[0]
    h_at_party = transport.broadcast("latent", h, shape=(n_samples, batch_size, world.cfg.h_dim))

    sum_likelihood = transport.aggregate("likelihood", world.likelihood_contributions(h_at_party, batch))

    if not world.hosts_active:
        return None, None
    return world.active.log_weights(h, log_q_h, sum_likelihood, world.active_generator), h


def stage1_loss(world: World, batch: Batch) -> Tensor | None:
    """Negative kappa-sample IWAE bound of log p(x_obs) (FALSE-VFL-II: of log p(x_obs, m)),
    averaged over the batch; None on processes that do not host the active party."""
    log_w, _ = forward_rounds(world, batch, world.cfg.kappa)
    return None if log_w is None else -iwae_bound(log_w).mean()


def stage2_loss(world: World, batch: Batch) -> Tensor | None:
    """Negative conditional bound L'_kappa over the discriminator only: the forward rounds run
    without gradients (the generative part is frozen), so no backward round ever leaves the
    active party and no label-dependent value reaches a passive party."""
    with torch.no_grad():
        log_w, h = forward_rounds(world, batch, world.cfg.kappa)
    if log_w is None:
        return None
    if batch.y is None:
        raise InputError("stage 2 needs the labels of the batch at the active party")
    return -conditional_bound(log_w, world.active.label_log_prob(h, batch.y)).mean()


@torch.no_grad()
def predict(world: World, batch: Batch) -> Tensor | None:
    """SNIS prediction with L = cfg.predict_samples: class probabilities (B, C) at the active
    party (for regression: (B,) predicted means), None elsewhere."""
    log_w, h = forward_rounds(world, batch, world.cfg.predict_samples)
    if log_w is None:
        return None
    out = world.active.label_distribution(h)
    if world.cfg.task == "classification":
        return snis_predict(log_w, out)
    return snis_predict(log_w, out[..., :1]).squeeze(-1)
