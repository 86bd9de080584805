"""Empty cells inside a block a party holds: the likelihood covers the observed cells only (against a
hand-computed Gaussian density), nothing flows from or depends on an unobserved cell, the encoder sees the
mask under `cell_handling="mask"` and not under "mean", a fully observed run computes exactly as without
the cell path, and the simulated cell removal follows its documented rules."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from cells import with_missing_cells
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.bounds import observed_gaussian_log_prob
from falsevfl_secure.config import Config, StageConfig
from falsevfl_secure.data import DataError, load_dataset, make_test_split, make_train_split
from falsevfl_secure.data.synthetic import synthetic_split
from falsevfl_secure.errors import InputError
from falsevfl_secure.methods import build_node, make_config
from falsevfl_secure.methods.false_vfl_steps import stage1_loss
from falsevfl_secure.model import PartyModel, initialise
from falsevfl_secure.model.party import likelihood_terms
from falsevfl_secure.randomness import KeyStream, RoleSecret
from falsevfl_secure.train import host_split
from falsevfl_secure.transport import LocalTransport

CPU = torch.device("cpu")


def small_config(parties: int = 3, variant: str = "I", **kw) -> Config:
    base = Config(dataset="synthetic", parties=parties, options={"variant": variant}, h_dim=6, z_dim=3, party_hidden=16,
                  global_hidden=16, discriminator_hidden=16, indicator_hidden=8, kappa=4, predict_samples=5,
                  pretrain=StageConfig(1e-2, 16, 2), train=StageConfig(1e-2, 16, 2), eval_batch_size=32)
    return replace(base, **kw)


def world_and_data(cfg: Config, split):
    widths = {k: b.shape[1] for k, b in enumerate(split.blocks)}
    secrets = {k: RoleSecret.for_tests(7, k) for k in widths}
    world = build_node(cfg, widths, 3, LocalTransport(cfg.parties, cfg.active_index), CPU, secrets)
    return world, host_split(split.view(range(cfg.parties), True), CPU, 3)


def party_model(width: int, variant: str = "I", cell_mask: bool = True, seed: int = 0) -> PartyModel:
    model = PartyModel(width, 4, 12, variant, 0.1, 6, cell_mask=cell_mask).double()
    return initialise(model, RoleSecret.for_tests(seed, 0).stream("party/init")).double()


def loss_and_grads(cfg: Config, split) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    world, data = world_and_data(cfg, split)
    loss = stage1_loss(world, data.batch(np.arange(split.n))).get()
    loss.backward()
    grads = {f"{k}.{n}": None if p.grad is None else p.grad.clone()
             for k, r in world.parties.items() for n, p in r.model.named_parameters()}
    return loss.detach(), grads


# -- the likelihood over observed cells ----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 7), width=st.integers(1, 6), samples=st.integers(1, 4), rate=st.floats(0, 0.9),
       seed=st.integers(0, 10_000))
def test_likelihood_is_the_gaussian_density_of_the_observed_cells(batch, width, samples, rate, seed):
    rng = np.random.default_rng(seed)
    model = party_model(width, seed=seed)
    x = rng.standard_normal((batch, width))
    observed = rng.random((batch, width)) >= rate
    held = rng.random(batch) < 0.7
    h = torch.as_tensor(rng.standard_normal((samples, batch, 4)))
    got = model.log_likelihood_contribution(h, torch.as_tensor(x), torch.as_tensor(held), None,
                                            torch.as_tensor(observed)).detach().numpy()
    mean, std = (t.detach().numpy() for t in model.decode(h))
    expected = np.zeros((samples, batch))
    for j in range(samples):
        for b in range(batch):
            if held[b]:
                expected[j, b] = sum(-0.5 * ((x[b, i] - mean[j, b, i]) / std[j, b, i]) ** 2 - math.log(std[j, b, i])
                                     - 0.5 * math.log(2 * math.pi) for i in range(width) if observed[b, i])
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_observed_density_with_every_cell_observed_is_the_full_density():
    torch.manual_seed(0)
    x, mean, std = torch.randn(3, 5, 4), torch.randn(3, 5, 4), torch.rand(3, 5, 4) + 0.2
    full = torch.distributions.Normal(mean, std).log_prob(x).sum(-1)
    torch.testing.assert_close(observed_gaussian_log_prob(x, mean, std, torch.ones(3, 5, 4, dtype=torch.bool)), full)
    assert torch.equal(observed_gaussian_log_prob(x, mean, std, torch.zeros(4, dtype=torch.bool)), torch.zeros(3, 5))


@settings(max_examples=25, deadline=None)
@given(variant=st.sampled_from(["I", "II"]), rate=st.sampled_from([0.2, 0.6]), seed=st.integers(0, 10_000))
def test_no_gradient_reaches_the_decoder_outputs_of_unobserved_cells(variant, rate, seed):
    rng = np.random.default_rng(seed)
    mean = torch.tensor(rng.standard_normal((3, 6, 5)), requires_grad=True)
    std = torch.tensor(rng.random((3, 6, 5)) + 0.1, requires_grad=True)
    observed = torch.as_tensor(rng.random((6, 5)) >= rate)
    held = torch.ones(6, dtype=torch.bool)
    indicator = None if variant == "I" else (lambda v: v.sum(-1, keepdim=True))
    noise = torch.as_tensor(rng.standard_normal((3, 6, 5))) if indicator else None
    x = torch.as_tensor(rng.standard_normal((6, 5)))
    likelihood_terms(mean, std, x, held, None, None, observed).sum().backward()
    assert torch.all(mean.grad[:, ~observed] == 0) and torch.all(std.grad[:, ~observed] == 0)
    assert torch.all(mean.grad[:, observed] != 0)
    if indicator is not None:  # FALSE-VFL-II: an unobserved cell is the decoder's draw, observed ones the data
        mean.grad = std.grad = None
        likelihood_terms(mean, std, x, held, indicator, noise, observed).sum().backward()
        assert torch.all(mean.grad[:, ~observed] != 0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), variant=st.sampled_from(["I", "II"]), handling=st.sampled_from(["mask", "mean"]))
def test_values_in_unobserved_cells_change_nothing(seed, variant, handling):
    split = with_missing_cells(synthetic_split(n=16, parties=3, p_missing=0.3, seed=seed), 0.4, seed)
    cfg = small_config(3, variant, cell_handling=handling)
    results = []
    for fill in (0.0, 7.0, np.nan):
        other = replace(split, blocks=[np.where(o, b, np.float32(fill)) for b, o in zip(split.blocks, split.observed,
                                                                                         strict=True)])
        results.append(loss_and_grads(cfg, other))
    for loss, grads in results[1:]:
        assert torch.equal(loss, results[0][0])
        assert all((g is None and results[0][1][n] is None) or torch.equal(g, results[0][1][n])
                   for n, g in grads.items())


# -- the mask input and the two handlings ---------------------------------------------------------------


def test_an_untrained_mask_input_encodes_as_mean_imputation_and_a_trained_one_sees_the_mask():
    rng = np.random.default_rng(0)
    model = party_model(6)
    x = torch.as_tensor(rng.standard_normal((5, 6)))
    observed = torch.as_tensor(rng.random((5, 6)) > 0.3)
    imputed = torch.where(observed, x, torch.zeros_like(x))
    assert torch.equal(model.cell_weight, torch.zeros(12, 6))  # zero-initialised: no draw, no effect yet
    torch.testing.assert_close(model.encode(x, observed), model.encoder(imputed))
    with torch.no_grad():
        model.cell_weight.copy_(KeyStream(bytes(32)).symmetric((12, 6), 1.0))
    assert not torch.allclose(model.encode(x, observed), model.encoder(imputed))
    assert torch.equal(model.encode(x, None), model.encoder(x))  # no mask given: the plain encoder


def test_mean_handling_treats_the_imputed_cells_as_data():
    split = with_missing_cells(synthetic_split(n=20, parties=3, p_missing=0.2, seed=3), 0.3, 3)
    as_data = replace(split, observed=None)  # the same zero-imputed blocks, no mask at all
    mean, _ = loss_and_grads(small_config(cell_handling="mean"), split)
    assert torch.equal(mean, loss_and_grads(small_config(cell_handling="mean"), as_data)[0])
    assert torch.equal(mean, loss_and_grads(small_config(cell_handling="mask"), as_data)[0])
    masked, grads = loss_and_grads(small_config(cell_handling="mask"), split)
    assert not torch.equal(masked, mean)
    assert all(grads[f"{k}.cell_mask.weight"] is not None for k in range(3))


@pytest.mark.parametrize("stack", ["never", "always"])
@pytest.mark.parametrize("variant", ["I", "II"])
def test_a_fully_observed_run_computes_exactly_as_without_the_cell_path(variant, stack):
    """All cells observed: the mask architecture (with no mask, or with an all-observed mask) and the mean
    handling give bit-identical losses and gradients, and the cell weights get no gradient at all."""
    split = synthetic_split(n=24, parties=3, p_missing=0.3, seed=11)
    all_cells = replace(split, observed=[np.repeat(~split.missing[:, [k]], b.shape[1], axis=1)
                                         for k, b in enumerate(split.blocks)])
    reference = loss_and_grads(small_config(3, variant, cell_handling="mean", stack_parties=stack), split)
    for data in (split, all_cells):
        loss, grads = loss_and_grads(small_config(3, variant, cell_handling="mask", stack_parties=stack), data)
        assert torch.equal(loss, reference[0])
        assert all(grads[f"{k}.cell_mask.weight"] is None for k in range(3))
        assert all(torch.equal(g, reference[1][n]) for n, g in grads.items() if g is not None)


def test_the_handling_is_part_of_the_fingerprint_and_is_validated(refused):
    assert make_config("digits", cell_handling="mask").fingerprint() != make_config(
        "digits", cell_handling="mean").fingerprint()
    for bad in ({"cell_handling": "median"}, {"cell_missing": 1.0}, {"cell_missing": -0.1}):
        with pytest.raises(InputError, match=next(iter(bad))):
            make_config("digits", **bad)
        refused("config")


# -- hosted data ------------------------------------------------------------------------------------------


def test_hosted_data_keeps_masks_only_where_a_held_cell_is_empty_and_zeroes_the_empty_cells():
    split = with_missing_cells(synthetic_split(n=30, parties=3, p_missing=0.2, seed=4), 0.3, 4, parties=[1])
    blocks = [b.copy() for b in split.blocks]
    blocks[1][~split.observed[1]] = np.nan  # a table reader may leave NaN in an empty cell
    data = host_split(replace(split, blocks=blocks).view(range(3), True), CPU, 3)
    assert set(data.observed) == {1}
    assert torch.equal(data.observed[1], torch.as_tensor(split.observed[1]))
    assert torch.all(data.x[1][~data.observed[1]] == 0)
    batch = data.batch(np.array([3, 1, 4]))
    assert torch.equal(batch.observed[1], data.observed[1][[3, 1, 4]])


def test_bad_cell_masks_are_refused(refused):
    split = with_missing_cells(synthetic_split(n=10, parties=2, p_missing=0.0, seed=5), 0.3, 5)
    empty_row = [o.copy() for o in split.observed]
    empty_row[0][2] = False
    cases = [(replace(split, observed=empty_row), "party 0: 1 rows it holds have no observed cell"),
             (replace(split, observed=[o[:, :2] for o in split.observed]), "party 0: its observed-cell mask"),
             (replace(split, observed=[o.astype(int) for o in split.observed]), "party 0: its observed-cell mask")]
    nan_observed = [b.copy() for b in split.blocks]
    nan_observed[1][split.observed[1]] = np.nan
    cases.append((replace(split, blocks=nan_observed), "party 1: its feature block contains NaN"))
    for bad, message in cases:
        with pytest.raises(InputError, match=message):
            host_split(bad.view(range(2), True), CPU, 3)
        refused("batch or split")


# -- simulated cell removal ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_cell_removal_rate_nesting_and_zeroed_values(digits):
    plain = make_train_split(digits, 4, "mcar:0.2", seed=0)
    splits = {r: make_train_split(digits, 4, "mcar:0.2", seed=0, cell_missing=r) for r in (0.1, 0.3)}
    assert plain.observed is None
    for rate, split in splits.items():
        assert np.array_equal(split.index, plain.index) and np.array_equal(split.missing, plain.missing)
        for k, (block, observed) in enumerate(zip(split.blocks, split.observed, strict=True)):
            held = ~split.missing[:, k]
            assert abs((~observed[held]).mean() - rate) < 0.01
            assert not observed[~held].any() and np.all(block[~observed] == 0)
            assert np.array_equal(block[observed], plain.blocks[k][observed])
    for k in range(4):  # the cells removed at 10 % are among those removed at 30 %
        assert np.all(splits[0.3].observed[k] <= splits[0.1].observed[k])
    again = make_train_split(digits, 4, "mcar:0.2", seed=0, cell_missing=0.3)
    assert all(np.array_equal(a, b) for a, b in zip(again.observed, splits[0.3].observed, strict=True))


def test_the_test_patterns_lose_the_same_cells(digits):
    a = make_test_split(digits, 4, "mcar:0", seed=1, cell_missing=0.3)
    b = make_test_split(digits, 4, "mnar:0.7", seed=1, cell_missing=0.3)
    for k in range(4):
        rows = np.intersect1d(a.index[~a.missing[:, k]], b.index[~b.missing[:, k]])
        in_a, in_b = np.searchsorted(a.index, rows), np.searchsorted(b.index, rows)
        assert rows.size and np.array_equal(a.observed[k][in_a], b.observed[k][in_b])


def test_a_block_that_loses_every_cell_is_a_missing_block_except_in_the_aligned_reserve(digits):
    split = make_train_split(digits, 8, "mcar:0", seed=2, n_labeled=400, n_aligned=200, cell_missing=0.95)
    widths = [b.shape[1] for b in split.blocks]  # 8 cells per block: 0.95^8 = 66 % of blocks lose all
    assert set(widths) == {8}
    held = ~split.missing
    assert held[split.aligned].all()  # the reserve keeps every block
    assert split.missing[~split.aligned].mean() > 0.5  # emptied blocks became missing blocks
    for k, observed in enumerate(split.observed):
        assert observed[held[:, k]].any(axis=1).all()  # every held block has an observed cell
    assert not split.missing.all(axis=1).any() and split.dropped > 0  # the empty-row rule ran after
    with pytest.raises(DataError, match="cell_missing"):
        make_test_split(digits, 4, "mcar:0", seed=0, cell_missing=1.0)


def test_simulate_flags_reach_the_config():
    from falsevfl_secure.simulate import configure, parse_args

    cfg, _ = configure(parse_args(["--cell-missing", "0.1", "--cell-handling", "mean"]))
    assert cfg.cell_missing == 0.1 and cfg.cell_handling == "mean"
    default, _ = configure(parse_args([]))
    assert default.cell_missing == 0.0 and default.cell_handling == "mask"
