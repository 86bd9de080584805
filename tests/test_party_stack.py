"""The batched party networks (`PartyStack`) compute what the K separate networks compute: the same
contributions, the same loss, the same gradient in each party's own parameters, the same random
draws, and they refuse what they cannot batch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from cells import with_missing_cells
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.config import Config, StageConfig
from falsevfl_secure.data.synthetic import synthetic_split
from falsevfl_secure.methods import build_node
from falsevfl_secure.methods.false_vfl_steps import predict, stage1_loss
from falsevfl_secure.model import PartyModel, PartyStack
from falsevfl_secure.model.party_stack import stacked_mlp
from falsevfl_secure.randomness import RoleSecret
from falsevfl_secure.train import host_split
from falsevfl_secure.transport import LocalTransport


def make_world(cfg: Config, widths: dict, n_classes: int, transport, device):
    """Every party's node with its secret fixed, so the stacked and sequential builds are the same models."""
    secrets = {k: RoleSecret.for_tests(cfg.seed, k) for k in widths}
    return build_node(cfg, widths, n_classes, transport, device, secrets)

CPU = torch.device("cpu")


def build(cfg: Config, split, stack: str):
    cfg = replace(cfg, stack_parties=stack)
    world = make_world(cfg, {k: b.shape[1] for k, b in enumerate(split.blocks)}, 3,
                       LocalTransport(cfg.parties, cfg.active_index), CPU)
    return world, host_split(split.view(range(cfg.parties), True), CPU, 3)


@settings(max_examples=30, deadline=None)
@given(parties=st.integers(2, 6), variant=st.sampled_from(["I", "II"]), batch=st.integers(1, 20),
       kappa=st.integers(1, 5), width=st.integers(1, 9), p=st.sampled_from([0.0, 0.3, 0.9]),
       cells=st.sampled_from([0.0, 0.3, 0.8]), with_mask=st.integers(0, 63), handling=st.sampled_from(["mask", "mean"]),
       seed=st.integers(0, 10_000))
def test_stacked_parties_equal_sequential_parties(parties, variant, batch, kappa, width, p, cells, with_mask, handling,
                                                  seed):
    torch.set_num_threads(1)
    cfg = Config(dataset="synthetic", parties=parties, options={"variant": variant}, h_dim=5, z_dim=3, party_hidden=11,
                 global_hidden=7, discriminator_hidden=7, indicator_hidden=6, kappa=kappa, predict_samples=kappa + 2,
                 pretrain=StageConfig(1e-3, batch, 1), seed=seed, cell_handling=handling)
    split = synthetic_split(n=batch, parties=parties, width=width, p_missing=p, seed=seed)
    if cells:  # empty cells at the parties picked by the bits of `with_mask` (the others observe every cell)
        split = with_missing_cells(split, cells, seed, [k for k in range(parties) if with_mask >> k & 1])
    results = {}
    for stack in ("never", "always"):
        world, data = build(cfg, split, stack)
        assert (world.stack is not None) == (stack == "always")
        b = data.batch(np.arange(batch))
        loss = stage1_loss(world, b).get()
        loss.backward()
        grads = {f"{k}.{n}": p.grad for k, r in world.parties.items() for n, p in r.model.named_parameters()}
        results[stack] = (loss.item(), grads, predict(world, b).get())
    (loss_a, grads_a, pred_a), (loss_b, grads_b, pred_b) = results["never"], results["always"]
    assert np.isclose(loss_a, loss_b, rtol=1e-5, atol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        # a cell weight has a gradient exactly where its party has a cell mask, on both paths
        assert (grads_a[name] is None) == (grads_b[name] is None), name
        if grads_a[name] is None:
            continue
        # float32 sums in a different order: an element's rounding error scales with the largest terms of
        # the tensor it is summed into, not with the element itself, so the absolute tolerance does too.
        # A batching bug (a party's rows sent through another party's weights, a dropped term) is O(scale).
        scale = max(grads_a[name].abs().max().item(), 1.0)
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=5e-5 * scale, msg=name)
    torch.testing.assert_close(pred_b, pred_a, rtol=1e-4, atol=1e-6)


def test_stacked_mlp_applies_each_party_its_own_network():
    torch.manual_seed(0)
    mlps = [torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2)) for _ in range(3)]
    x = torch.randn(3, 5, 4)
    expected = torch.stack([m(x[k]) for k, m in enumerate(mlps)])
    torch.testing.assert_close(stacked_mlp(mlps, x), expected)
    with pytest.raises(TypeError, match="no batched rule"):
        stacked_mlp([torch.nn.Sequential(torch.nn.Tanh())] * 2, x)


def test_parties_of_different_widths_are_not_stacked():
    models = {0: PartyModel(4, 3, 8), 1: PartyModel(5, 3, 8)}
    assert not PartyStack.can_stack(models)
    assert not PartyStack.can_stack({0: models[0]})  # nothing to batch
    with pytest.raises(ValueError, match="identically shaped"):
        PartyStack(models)
    cfg = Config(dataset="synthetic", parties=2, stack_parties="always")
    world = make_world(cfg, {0: 4, 1: 5}, 3, LocalTransport(2, 1), CPU)
    assert world.stack is None  # falls back to one network after the other


def test_auto_does_not_stack_on_the_cpu():
    cfg = Config(dataset="synthetic", parties=3, h_dim=4, z_dim=2, party_hidden=8, global_hidden=8)
    world = make_world(cfg, {0: 3, 1: 3, 2: 3}, 3, LocalTransport(3, 2), CPU)
    assert cfg.stack_parties == "auto" and world.stack is None
