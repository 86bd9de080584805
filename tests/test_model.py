"""The FALSE-VFL core in the local runtime: posterior aggregation, freezing, SNIS, regression,
bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from cells import with_missing_cells
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.config import Config, Stage, StageConfig
from falsevfl_secure.data.synthetic import synthetic_split
from falsevfl_secure.errors import InputError, ProtocolError
from falsevfl_secure.methods import build_node
from falsevfl_secure.methods.false_vfl_steps import forward_rounds, predict, stage1_loss
from falsevfl_secure.placement import Active
from falsevfl_secure.randomness import RoleSecret
from falsevfl_secure.train import evaluate, host_split, pretrain, train_discriminator
from falsevfl_secure.transport import LocalTransport
from falsevfl_secure.transport.rounds import POSTERIOR

CPU = torch.device("cpu")


def small_config(parties: int = 3, variant: str = "I", **kw) -> Config:
    base = Config(dataset="synthetic", parties=parties, options={"variant": variant}, h_dim=6, z_dim=3, party_hidden=16,
                  global_hidden=16, discriminator_hidden=16, indicator_hidden=8, kappa=4, predict_samples=5,
                  pretrain=StageConfig(1e-2, 16, 2), train=StageConfig(1e-2, 16, 2), eval_batch_size=32)
    return replace(base, **kw)


def world_and_data(cfg: Config, split, n_classes: int = 3):
    """The local node of every party (secrets fixed per party, so repeated builds are identical)."""
    widths = {k: b.shape[1] for k, b in enumerate(split.blocks)}
    secrets = {k: RoleSecret.for_tests(cfg.seed, k) for k in widths}
    world = build_node(cfg, widths, n_classes, LocalTransport(cfg.parties, cfg.active_index), CPU, secrets)
    labels = n_classes if cfg.task == "classification" else None
    return world, host_split(split.view(range(cfg.parties), True), CPU, labels)


@settings(max_examples=20, deadline=None)
@given(parties=st.integers(2, 5), seed=st.integers(0, 10_000), p=st.sampled_from([0.0, 0.4, 0.9]))
def test_aggregated_posterior_is_mean_and_precision_sum_over_observed_parties(parties, seed, p):
    split = synthetic_split(n=12, parties=parties, p_missing=p, seed=seed)
    cfg = small_config(parties)
    world, data = world_and_data(cfg, split)
    batch = data.batch(np.arange(split.n))
    contributions = {k: r.model.posterior_contribution(batch.x[k], batch.held[k]) for k, r in world.parties.items()}
    total = world.transport.aggregate(POSTERIOR, contributions).get()
    for i in range(split.n):
        observed = [k for k in range(parties) if not split.missing[i, k]]
        outs = [world.parties[k].model.encoder(batch.x[k][i:i + 1]) for k in observed]
        means = torch.cat([o[:, :cfg.h_dim] for o in outs])
        precisions = torch.cat([torch.nn.functional.softplus(o[:, cfg.h_dim:]) + 1e-3 for o in outs])
        assert torch.allclose(total[i, :cfg.h_dim] / len(observed), means.mean(0), atol=1e-6)
        assert torch.allclose(total[i, cfg.h_dim:], precisions.sum(0), atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), variant=st.sampled_from(["I", "II"]))
def test_values_in_rows_a_party_does_not_hold_change_nothing(seed, variant):
    split = synthetic_split(n=16, parties=3, p_missing=0.5, seed=seed)
    cfg = small_config(3, variant)
    results = []
    for fill in (0.0, 1.0):
        other = replace(split, blocks=[np.where(split.missing[:, [k]], fill * (k + 5), b).astype(np.float32)
                                       for k, b in enumerate(split.blocks)])
        world, data = world_and_data(cfg, other)
        loss = stage1_loss(world, data.batch(np.arange(other.n))).get()
        loss.backward()
        grads = [p.grad.clone() for r in world.parties.values() for p in r.model.parameters() if p.grad is not None]
        results.append((loss.detach(), grads))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("variant", ["I", "II"])
def test_stage2_freezes_generative_parameters_and_stage1_changes_them(variant):
    split = with_missing_cells(synthetic_split(n=48, parties=3, seed=1), 0.2, 1)  # so the cell weights train too
    cfg = small_config(3, variant)
    world, data = world_and_data(cfg, split)
    active = world.active.get().model
    before = {k: snapshot(r.model) for k, r in world.parties.items()}
    before_active = snapshot(active)
    pretrain(world, data, progress=False)
    after1 = {k: snapshot(r.model) for k, r in world.parties.items()}
    after1_active = snapshot(active)
    for k in before:
        assert all(not torch.equal(before[k][n], after1[k][n]) for n in before[k])
    for name, value in after1_active.items():
        changed = not torch.equal(before_active[name], value)
        assert changed == (not name.startswith("discriminator")), name
    train_discriminator(world, data, progress=False)
    for k in before:
        assert all(torch.equal(after1[k][n], world.parties[k].model.state_dict()[n]) for n in after1[k])
    for name, value in active.state_dict().items():
        assert torch.equal(after1_active[name], value) == (not name.startswith("discriminator")), name


def test_snis_with_one_sample_equals_the_discriminator_at_that_sample():
    split = synthetic_split(n=10, parties=2, seed=2)
    cfg = small_config(2, predict_samples=1)
    world, data = world_and_data(cfg, split)
    batch = data.batch(np.arange(split.n))
    world.restart_noise(Stage.PREDICT)
    probs = predict(world, batch).get()
    world.restart_noise(Stage.PREDICT)
    with torch.no_grad():
        h = forward_rounds(world, batch, 1, Stage.PREDICT).get().h
        direct = world.active.get().model.discriminator(h[0]).softmax(-1)
    assert torch.allclose(probs, direct, atol=1e-6)
    assert torch.allclose(probs.sum(-1), torch.ones(split.n))


def test_regression_end_to_end_beats_predicting_the_mean():
    split = synthetic_split(n=400, parties=3, seed=3, regression=True, p_missing=0.2)
    cfg = small_config(3, task="regression", pretrain=StageConfig(5e-3, 64, 25), train=StageConfig(5e-3, 64, 40))
    world, data = world_and_data(cfg, split, n_classes=1)
    pretrain(world, data, progress=False)
    train_discriminator(world, data, progress=False)
    rmse = evaluate(world, data).get()
    baseline = float(np.sqrt(((split.y - split.y.mean()) ** 2).mean()))
    assert rmse < 0.7 * baseline, (rmse, baseline)


def test_classification_learns_on_synthetic_data():
    split = synthetic_split(n=300, parties=3, seed=4, p_missing=0.2)
    cfg = small_config(3, pretrain=StageConfig(5e-3, 64, 20), train=StageConfig(5e-3, 64, 40))
    world, data = world_and_data(cfg, split)
    pretrain(world, data, progress=False)
    train_discriminator(world, data, progress=False)
    assert evaluate(world, data).get() > 60.0  # three balanced classes: chance is 33 %


def test_bad_input_is_refused_with_clear_errors(refused):
    split = synthetic_split(n=8, parties=2, seed=5)
    cfg = small_config(2)
    world, data = world_and_data(cfg, split)
    batch = data.batch(np.arange(8))
    wrong_width = replace(batch, x={**batch.x, 0: batch.x[0][:, :3]})
    with pytest.raises(InputError, match="party 0.*feature block"):
        stage1_loss(world, wrong_width)
    refused("batch or split")
    with pytest.raises(InputError, match="empty batch"):
        stage1_loss(world, data.batch(np.arange(0)))
    refused("batch or split")
    no_party = replace(batch, n_observed=Active(torch.zeros(8)))
    with pytest.raises(InputError, match="no observed party"):
        stage1_loss(world, no_party)
    refused("batch or split")
    nan_split = replace(split, blocks=[split.blocks[0].copy(), split.blocks[1]])
    nan_split.blocks[0][0, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        host_split(nan_split.view(range(2), True), CPU, 3)
    refused("batch or split")
    with pytest.raises(InputError, match="labels must lie"):
        host_split(replace(split, y=split.y + 10).view(range(2), True), CPU, 3)
    refused("batch or split")
    empty_rows = replace(split, missing=np.ones_like(split.missing))
    with pytest.raises(InputError, match="no observed party"):
        host_split(empty_rows.view(range(2), True), CPU, 3)
    refused("batch or split")
    with pytest.raises(InputError, match="labels must be integers"):
        from falsevfl_secure.methods.false_vfl_steps import stage2_loss

        stage2_loss(world, replace(batch, y=batch.y.map(lambda y: y + 7)))
    refused("batch or split")
    inf_batch = replace(batch, x={**batch.x, 1: batch.x[1].clone().fill_(float("inf"))})
    with pytest.raises(ProtocolError, match="posterior.*non-finite"):
        stage1_loss(world, inf_batch)
    refused("batch or split")
