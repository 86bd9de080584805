"""The latent gradient in two sample moments (`transport.moments`) gives the gradients of today's form.

Today's form: every party returns its full gradient w.r.t. the broadcast samples h (S, B, H) and the
active party backpropagates their sum through h = mu + sigma * eps. The compressed form returns
(sum_s g, sum_s g (h - hbar)) (2, B, H). Checked in float64 to 1e-6 relative, on the closed form alone
(hypothesis over S, B, H and magnitudes) and on whole FALSE-VFL steps against an uncompressed clear
reference transport (hypothesis over parties, variants, batch, kappa and missing blocks).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from falsevfl_secure.config import Config, Stage, StageConfig
from falsevfl_secure.errors import ProtocolError
from falsevfl_secure.methods.false_vfl_steps import samples_from_moments, stage1_loss
from falsevfl_secure.placement import Active
from falsevfl_secure.runtime.session import StepJob, build_step
from falsevfl_secure.transport.accounting import CommLog
from falsevfl_secure.transport.in_process import LocalTransport
from falsevfl_secure.transport.moments import gradient_from_moments, sample_moments

RTOL = 1e-6


def _gradients(h_of, mu, sigma, losses, through_moments: bool):
    """d(sum of `losses`)/d(mu, sigma): the summed per-party gradient w.r.t. h, or its moments."""
    h = h_of(mu, sigma)
    leaf = h.detach().requires_grad_()
    grads = [torch.autograd.grad(loss(leaf), leaf)[0] for loss in losses]  # one per party
    if through_moments:
        total = sum(sample_moments(g, leaf.detach()) for g in grads)
        return torch.autograd.grad(h, (mu, sigma), gradient_from_moments(total, h.detach()))
    return torch.autograd.grad(h, (mu, sigma), sum(grads))


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 12), b=st.integers(1, 6), h=st.integers(1, 5), parties=st.integers(1, 4),
       scale=st.sampled_from([1e-3, 1.0, 1e2, 1e4]), spread=st.sampled_from([1e-4, 1e-1, 1.0, 30.0]),
       seed=st.integers(0, 2**31 - 1))
def test_moments_give_the_gradient_of_mu_and_sigma_exactly(s, b, h, parties, scale, spread, seed):
    gen = np.random.default_rng(seed)  # test data only
    mu = torch.tensor(gen.normal(0, scale, (b, h)), requires_grad=True)
    sigma = torch.tensor(gen.uniform(0.1, 1.0, (b, h)) * spread, requires_grad=True)
    eps = torch.tensor(gen.normal(size=(s, b, h)))
    weights = [torch.tensor(gen.normal(size=(s, b, h))) for _ in range(parties)]

    def loss_of(w):  # a different nonlinear function of h per party, as each party's decoder is
        return lambda x: (w * torch.tanh(x / (scale + spread)) + 0.1 * w * w * x / (scale + spread)).sum()

    def h_of(m, sd):
        return m + sd * eps

    losses = [loss_of(w) for w in weights]
    want = _gradients(h_of, mu, sigma, losses, through_moments=False)
    got = _gradients(h_of, mu, sigma, losses, through_moments=True)
    for a, e in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=RTOL, atol=RTOL * float(e.abs().max()) + 1e-300)


def test_one_sample_and_coinciding_samples_need_no_division():
    h = torch.tensor([[[1.0, 2.0]], [[1.0, 5.0]]], dtype=torch.float64)  # entry 0: both samples equal
    g = torch.tensor([[[0.5, 1.0]], [[-0.25, 3.0]]], dtype=torch.float64)
    out = gradient_from_moments(sample_moments(g, h), h)
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.sum(0).numpy(), g.sum(0).numpy())
    np.testing.assert_allclose(out[:, 0, 0].numpy(), [0.125, 0.125])  # equal samples: A / S each
    one = h[:1]
    np.testing.assert_allclose(gradient_from_moments(sample_moments(g[:1], one), one).numpy(), g[:1].numpy())


class ClearReference:
    """Today's form, with no validation or accounting: the broadcast's adjoint sums full gradients."""

    def __init__(self, n_parties: int) -> None:
        self.n_parties, self.log = n_parties, CommLog()

    def use(self, table, sizes=None) -> None:
        pass

    def use_noise(self, stages) -> None:
        assert not stages  # the reference runs without differential privacy

    def aggregate(self, round, contributions):
        parties = sorted(contributions)
        total = contributions[parties[0]]
        for k in parties[1:]:
            total = total + contributions[k]
        return Active(total)

    def broadcast(self, round, value, shape):
        return {k: value.get().view_as(value.get()) for k in range(self.n_parties)}

    def backward(self, loss):
        loss.get().backward()


def _stage1_grads(job: StepJob, transport) -> dict[str, np.ndarray]:
    node, data = build_step(job, list(range(job.config.parties)), True, transport)
    for role in node.parties.values():
        role.model.double()
    node.active.get().model.double()
    data.x = {k: v.double() for k, v in data.x.items()}
    node.transport.backward(stage1_loss(node, data.batch(np.asarray(job.rows))))
    modules = [(f"party{k}", r.model) for k, r in node.parties.items()] + [("active", node.active.get().model)]
    return {f"{o}.{n}": p.grad.numpy().copy() for o, m in modules for n, p in m.named_parameters()
            if p.grad is not None}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(parties=st.integers(2, 5), variant=st.sampled_from(["I", "II"]), batch=st.integers(1, 12),
       kappa=st.integers(1, 8), p_missing=st.sampled_from([0.0, 0.3, 0.95]), seed=st.integers(0, 10_000),
       broadcast=st.sampled_from(["samples", "moments"]))
def test_a_stage1_step_has_todays_gradients(parties, variant, batch, kappa, p_missing, seed, broadcast):
    # "moments": the latent_moments broadcast's adjoint (a (B, 2H+16) sum) against plain autograd.
    torch.set_num_threads(1)
    cfg = Config(dataset="synthetic", parties=parties, options={"variant": variant, "latent_broadcast": broadcast},
                 h_dim=6, z_dim=3, party_hidden=8,
                 global_hidden=8, discriminator_hidden=8, indicator_hidden=4, kappa=kappa,
                 pretrain=StageConfig(1e-3, batch, 1), train=StageConfig(1e-3, batch, 1), seed=seed)
    split = dict(n=batch + 2, parties=parties, width=4, p_missing=p_missing, seed=seed)
    job = StepJob(cfg, split, tuple(range(1, batch + 1)), Stage.PRETRAIN, secret_seed=seed + 1)
    compressed = _stage1_grads(job, LocalTransport(parties, cfg.active_index))
    reference = _stage1_grads(job, ClearReference(parties))
    assert set(compressed) == set(reference) and any(k.startswith("party0.") for k in reference)
    for name, want in reference.items():
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(compressed[name], want, rtol=RTOL, atol=RTOL * scale, err_msg=name)


# -- the moments broadcast (`latent_broadcast = "moments"`): samples every holder draws from the keys ----

def _payload(loc: Tensor, scale: Tensor, keys: np.ndarray) -> Tensor:
    words = torch.from_numpy(keys.view("<u2").astype(np.float32)).to(loc.dtype)
    return torch.cat([loc, scale, words], dim=-1)


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 4), h=st.integers(1, 4), magnitude=st.sampled_from([1e-3, 1.0, 1e3]),
       seed=st.integers(0, 2**31))
def test_every_holder_draws_the_same_samples_with_the_posteriors_moments(b, h, magnitude, seed):
    g = torch.Generator().manual_seed(seed)  # test data only
    loc = torch.randn(b, h, generator=g, dtype=torch.float64) * magnitude
    scale = torch.rand(b, h, generator=g, dtype=torch.float64) * magnitude + 1e-3
    keys = np.frombuffer(os.urandom(32 * b), dtype=np.uint8).reshape(b, 32)
    payload = _payload(loc, scale, keys)
    s = 4000
    first, again = samples_from_moments(payload, s, h), samples_from_moments(payload.clone(), s, h)
    assert first.shape == (s, b, h) and torch.equal(first, again)
    eps = (first - loc) / scale  # N(0, 1) per row and coordinate: mean within 5 sd/sqrt(S), sd within 10 %
    assert eps.mean(0).abs().max() < 5 / s**0.5 and ((eps.std(0) - 1).abs() < 0.1).all()
    other = keys.copy()
    other[0, 0] ^= 1  # one bit of one row's key: that row's samples change, the others' do not
    moved = samples_from_moments(_payload(loc, scale, other), s, h)
    assert not torch.equal(moved[:, 0], first[:, 0]) and torch.equal(moved[:, 1:], first[:, 1:])


@pytest.mark.parametrize("word", [0.5, -1.0, 65536.0, float("nan"), float("inf")])
def test_key_words_that_are_not_16_bit_integers_are_refused(word):
    payload = _payload(torch.zeros(2, 3), torch.ones(2, 3), np.zeros((2, 32), np.uint8))
    payload[1, -3] = word
    with pytest.raises(ProtocolError, match="latent_moments.*16-bit words"):
        samples_from_moments(payload, 2, 3)


def _payload_keys(secret_seed: int | None, rows: tuple[int, ...]) -> list[np.ndarray]:
    """The key words the active party broadcasts in two successive steps of one run."""
    cfg = Config(dataset="synthetic", parties=3, h_dim=4, z_dim=2, party_hidden=8, global_hidden=8,
                 discriminator_hidden=8, kappa=2, pretrain=StageConfig(1e-3, 4, 1), train=StageConfig(1e-3, 4, 1),
                 options={"latent_broadcast": "moments"})
    job = StepJob(cfg, dict(n=8, parties=3, width=3, p_missing=0.3, seed=0), rows, Stage.PRETRAIN,
                  secret_seed=secret_seed)
    node, data = build_step(job, [0, 1, 2], True, LocalTransport(3, cfg.active_index))
    seen = []
    node.transport.broadcast = lambda r, value, shape, _b=node.transport.broadcast: (
        seen.append(value.get()[:, -16:].detach().numpy().copy()), _b(r, value, shape))[1]
    for _ in range(2):
        stage1_loss(node, data.batch(np.asarray(rows)))
    return seen


def test_row_keys_are_fresh_each_step_and_come_from_the_active_partys_secret():
    rows = (0, 1, 2, 3)
    first, second = _payload_keys(None, rows)
    assert not (first == second).all(axis=1).any()  # no row's key repeats from one step to the next
    again = _payload_keys(None, rows)
    assert not (again[0] == first).all(axis=1).any()  # a fresh secret: another run, other keys
    injected = _payload_keys(7, rows), _payload_keys(7, rows)  # tests may inject a role secret
    assert all((a == b).all() for a, b in zip(*injected, strict=True))
