"""Likelihoods that fit each column (model/likelihood.py), the active party's own columns in the
discriminator, balanced class weights, and the binary encoding: each against an independent truth
(torch.distributions, scikit-learn's formula, the plain local reference for every secure protocol)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_equivalence import check_equal, make_job
from torch.distributions import Bernoulli, Categorical, Normal

from falsevfl_secure.bounds import diagonal_gaussian_log_prob, observed_gaussian_log_prob
from falsevfl_secure.data.encoding import encode, fit_encoding
from falsevfl_secure.data.tables import read_party_table
from falsevfl_secure.model.active import ActiveModel, balanced_weights, own_features
from falsevfl_secure.model.likelihood import CellLayout, cell_log_likelihood
from falsevfl_secure.transport import PROTOCOLS

# A column list: ("numeric" | "binary", 1) or ("categorical", categories)
columns = st.lists(st.one_of(st.tuples(st.sampled_from(["numeric", "binary"]), st.just(1)),
                             st.tuples(st.just("categorical"), st.integers(1, 7))), min_size=1, max_size=6)


def layout_of(cols) -> CellLayout:
    kinds, start = [], 0
    for kind, width in cols:
        kinds.append((kind, start, start + width))
        start += width
    return CellLayout.from_kinds(kinds)


def draw_block(cols, rows: int, gen: torch.Generator, scale: float):
    """Values of each kind (normal, 0/1, one-hot), decoder outputs up to `scale`, a per-column observed mask."""
    x, observed, mean, std = [], [], [], []
    for kind, width in cols:
        seen = torch.rand(rows, 1, generator=gen) < 0.7
        observed.append(seen.expand(rows, width))
        if kind == "numeric":
            x.append(torch.randn(rows, 1, generator=gen) * 3)
        elif kind == "binary":
            x.append((torch.rand(rows, 1, generator=gen) < 0.4).float())
        else:
            x.append(torch.nn.functional.one_hot(torch.randint(width, (rows,), generator=gen), width).float())
        mean.append((torch.rand(rows, width, generator=gen) * 2 - 1) * scale)
        std.append(torch.rand(rows, width, generator=gen) * 2 + 0.05)
    return (torch.cat(x, 1).double(), torch.cat(observed, 1), torch.cat(mean, 1).double(), torch.cat(std, 1).double())


def expected_log_likelihood(cols, x, observed, mean, std) -> torch.Tensor:
    """The sum over observed columns of each column's torch.distributions log-probability."""
    total, start = torch.zeros(x.shape[0], dtype=x.dtype), 0
    for kind, width in cols:
        cells, seen = slice(start, start + width), observed[:, start]
        if kind == "numeric":
            term = Normal(mean[:, start], std[:, start]).log_prob(x[:, start])
        elif kind == "binary":
            term = Bernoulli(logits=mean[:, start]).log_prob(x[:, start])
        else:
            term = Categorical(logits=mean[:, cells]).log_prob(x[:, cells].argmax(1))
        total = total + torch.where(seen, term, torch.zeros_like(term))
        start += width
    return total


@settings(max_examples=60, deadline=None)
@given(cols=columns, rows=st.integers(1, 20), seed=st.integers(0, 2**31), scale=st.sampled_from([1.0, 10.0, 40.0]))
def test_every_column_kind_matches_torch_distributions(cols, rows, seed, scale):
    gen = torch.Generator().manual_seed(seed)  # test data only
    x, observed, mean, std = draw_block(cols, rows, gen, scale)
    got = cell_log_likelihood(layout_of(cols), x, mean, std, observed)
    torch.testing.assert_close(got, expected_log_likelihood(cols, x, observed, mean, std), rtol=1e-9, atol=1e-9)
    every = cell_log_likelihood(layout_of(cols), x, mean, std, None)  # None: every cell observed
    torch.testing.assert_close(every, expected_log_likelihood(cols, x, torch.ones_like(observed), mean, std))


@settings(max_examples=30, deadline=None)
@given(cols=columns, seed=st.integers(0, 2**31))
def test_unobserved_cells_change_nothing_and_pass_no_gradient(cols, seed):
    gen = torch.Generator().manual_seed(seed)
    x, observed, mean, std = draw_block(cols, 8, gen, 5.0)
    mean.requires_grad_(True)
    layout = layout_of(cols)
    cell_log_likelihood(layout, x, mean, std, observed).sum().backward()
    assert (mean.grad[~observed] == 0).all()
    garbage = torch.where(observed, x, torch.full_like(x, 123.0))
    torch.testing.assert_close(cell_log_likelihood(layout, garbage, mean, std, observed),
                               cell_log_likelihood(layout, x, mean, std, observed))


def test_an_all_numeric_layout_computes_exactly_the_papers_gaussian():
    gen = torch.Generator().manual_seed(0)
    x, mean, std = torch.randn(4, 3, 6, generator=gen), torch.randn(4, 3, 6, generator=gen), torch.rand(4, 3, 6) + .1
    observed = torch.rand(4, 3, 6, generator=gen) < 0.5
    layout = CellLayout.numeric(6)
    assert torch.equal(cell_log_likelihood(layout, x, mean, std, None), diagonal_gaussian_log_prob(x, mean, std))
    assert torch.equal(cell_log_likelihood(layout, x, mean, std, observed),
                       observed_gaussian_log_prob(x, mean, std, observed))


def test_a_malformed_layout_is_refused():
    with pytest.raises(ValueError, match="cell layout"):
        CellLayout.from_kinds([("numeric", 0, 2)])
    with pytest.raises(ValueError, match="cell layout"):
        CellLayout.from_kinds([("numeric", 0, 1), ("categorical", 2, 4)])


def test_two_valued_columns_are_encoded_zero_one_and_declared_binary(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,flag,score,colour\na,5,1.5,red\nb,7,2.0,blue\nc,,3.5,red\nd,5,,green\n")
    table = read_party_table(path, "bank", "id")
    encoding = fit_encoding(table)
    assert encoding.binary == ("flag",)
    assert encoding.kinds() == [("binary", 0, 1), ("numeric", 1, 2), ("categorical", 2, 5)]
    block = encode(table, encoding)
    np.testing.assert_array_equal(block.x[[0, 1, 3], 0], [0.0, 1.0, 0.0])
    assert not block.observed[2, 0]
    assert type(encoding).from_dict(encoding.to_dict()).binary == ("flag",)


def test_balanced_weights_are_scikit_learns():
    from sklearn.utils.class_weight import compute_class_weight

    y = np.array([0, 0, 0, 0, 1, 2, 2, 0, 1, 0])
    expected = compute_class_weight("balanced", classes=np.arange(3), y=y)
    np.testing.assert_allclose(balanced_weights(torch.from_numpy(y), 3).numpy(), expected, rtol=1e-6)
    assert balanced_weights(torch.tensor([0, 0, 1]), 3)[2] == 0  # a class with no row weighs nothing


def test_the_discriminator_reads_the_active_partys_own_block_only_where_it_holds_the_record():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    held = torch.tensor([True, True, False])
    observed = torch.tensor([[True, False], [True, True], [True, True]])
    own = own_features(x, held, observed)
    torch.testing.assert_close(own, torch.tensor([[1.0, 0, 1, 0, 1], [3, 4, 1, 1, 1], [0, 0, 0, 0, 0]]))
    model = ActiveModel(4, 2, 8, 3, 8, own_inputs=5)
    h = torch.randn(7, 3, 4)
    assert model.label_distribution(h, own).shape == (7, 3, 3)
    with pytest.raises(Exception, match="own block"):
        model.label_distribution(h)


KINDS = (("numeric", 0, 1), ("binary", 1, 2), ("categorical", 2, 5))  # every kind in a 5-cell block


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_typed_likelihoods_and_own_columns_give_the_plain_result_under_every_protocol(sessions, protocol):
    @settings(max_examples=4 if protocol == "he" else 6, deadline=None, suppress_health_check=list(HealthCheck))
    @given(variant=st.sampled_from(["I", "II"]), batch=st.integers(1, 16), seed=st.integers(0, 10_000),
           p=st.sampled_from([0.0, 0.3]), stage=st.sampled_from(["pretrain", "train", "predict"]),
           own=st.sampled_from(["latent", "latent+own", "latent+mean+own"]),
           scale=st.sampled_from([1.0, 3.0]))  # standardised cells: |x| <= 10
    @example(variant="I", batch=8, seed=3728, p=0.3, stage="pretrain", own="latent", scale=3.0)  # cancellation
    def run(variant, batch, seed, p, stage, own, scale):
        torch.set_num_threads(1)
        job = make_job(3, variant, batch, 3, seed, p, stage, scale=scale, kinds=KINDS)
        if own != "latent":
            from dataclasses import replace
            job = replace(job, config=job.config.with_options(discriminator_inputs=own))
        check_equal(sessions, protocol, job)

    run()


def test_cross_entropy_of_a_group_is_its_softmax():
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    x = torch.tensor([[0.0, 0.0, 1.0]])
    got = cell_log_likelihood(CellLayout.from_kinds([("categorical", 0, 3)]), x, logits, torch.ones(1, 3), None)
    assert math.isclose(float(got), float(torch.log_softmax(logits, -1)[0, 2]), rel_tol=1e-6)


@settings(max_examples=30, deadline=None)
@given(cols=columns, seed=st.integers(0, 2**31))
def test_a_typed_decoder_emits_a_std_for_gaussian_cells_only_and_is_read_in_kind_order(cols, seed):
    """The decoder's numbers, kind ordered (module docstring), scored against torch.distributions column by
    column; FALSE-VFL-II's stand-ins are the Gaussian cells' draws and the other kinds' probabilities."""
    from falsevfl_secure.model.likelihood import cell_means
    from falsevfl_secure.model.party import PartyModel, likelihood_terms

    gen = torch.Generator().manual_seed(seed)
    layout = layout_of(cols)
    x, observed, _, _ = draw_block(cols, 5, gen, 1.0)
    model = PartyModel(layout.width, 3, 8, layout=layout).double()
    first, std = model.decode(torch.randn(2, 5, 3, generator=gen, dtype=torch.float64))
    n_gaussian = sum(kind == "numeric" for kind, _ in cols)
    assert model.decoder[-1].out_features == (2 * layout.width if layout.all_gaussian else layout.width + n_gaussian)
    mean = layout.in_columns(first) if not layout.all_gaussian else first  # column order
    full_std = torch.ones_like(mean)
    full_std[..., list(layout.gaussian)] = std
    got = likelihood_terms(first, std, x, torch.ones(5, dtype=torch.bool), observed=observed, layout=layout)
    for s in range(2):
        torch.testing.assert_close(got[s], expected_log_likelihood(cols, x, observed, mean[s], full_std[s]))
    noise = torch.randn(first.shape, generator=gen, dtype=torch.float64)
    stand_in, start = cell_means(layout, first, std, noise), 0
    noise_at = noise if layout.all_gaussian else layout.in_columns(noise)
    for kind, width in cols:
        cells = slice(start, start + width)
        if kind == "numeric":
            expected = mean[..., cells] + full_std[..., cells] * noise_at[..., cells]
        else:
            expected = torch.sigmoid(mean[..., cells]) if kind == "binary" else torch.softmax(mean[..., cells], -1)
        torch.testing.assert_close(stand_in[..., cells], expected)
        start += width


def test_a_group_counts_as_observed_by_its_first_cell_alone():
    """The encoding marks a group's cells together; where a mask says otherwise, the first cell decides."""
    layout = CellLayout.from_kinds([("numeric", 0, 1), ("categorical", 1, 4), ("binary", 4, 5), ("categorical", 5, 7)])
    x = torch.tensor([[0.5, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
    mean = torch.tensor([[0.1, 2.0, -1.0, 0.5, 0.3, 1.5, -0.5]])
    std = torch.full((1, 7), 0.7)
    first_only = torch.tensor([[True, True, False, False, True, False, True]])  # group 1 by its first cell only
    expected = (Normal(0.1, 0.7).log_prob(torch.tensor(0.5))
                + Categorical(logits=mean[0, 1:4]).log_prob(torch.tensor(1))
                + Bernoulli(logits=torch.tensor(0.3)).log_prob(torch.tensor(1.0)))  # group 2's first cell unobserved
    torch.testing.assert_close(cell_log_likelihood(layout, x, mean, std, first_only)[0], expected)
