"""The active party's trees (`head = "network+trees"`, model/trees.py): what they read, the blend and its
weight chosen on validation records, the refit at `predict`, and the extra pass counted as a release."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_methods import node_and_data, small

from falsevfl_secure.bounds import latent_posterior
from falsevfl_secure.config import Stage
from falsevfl_secure.errors import InputError
from falsevfl_secure.methods.false_vfl_steps import encoded_count, forward_rounds, trees_inputs
from falsevfl_secure.model.trees import (
    BAG,
    MAX_CATEGORIES,
    MAX_ITER,
    WEIGHTS,
    TreesHead,
    categorical_mask,
    head_features,
)
from falsevfl_secure.privacy import releases_per_row
from falsevfl_secure.train import fit, predict_split


def _log_loss(p: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None)).mean())


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), n_classes=st.integers(2, 4))
def test_the_blend_is_the_weighted_mixture_and_validation_picks_its_best_weight(seed, n_classes):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(300, 3)), rng.integers(0, n_classes, 300)
    head = TreesHead("classification", n_classes, seed=0).fit(x[:200], y[:200])
    network = torch.from_numpy(rng.dirichlet(np.ones(n_classes), size=100))
    head.choose(network, x[200:], torch.from_numpy(y[200:]))
    trees = head.predict(x[200:]).numpy()
    losses = {w: _log_loss((1 - w) * network.numpy() + w * trees, y[200:]) for w in WEIGHTS}
    assert losses[head.weight] == pytest.approx(min(losses.values()), rel=1e-9)
    blended = head.blend(network, x[200:]).numpy()
    assert np.allclose(blended, (1 - head.weight) * network.numpy() + head.weight * trees)
    assert np.allclose(blended.sum(axis=1), 1.0)


def test_trees_that_fit_and_a_network_that_does_not_get_the_whole_weight_and_the_reverse():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 2))
    y = np.where(x[:, 0] * x[:, 1] > 0, 2.0, -2.0)  # an interaction trees split on
    fits = []
    head = TreesHead("regression", 1, seed=0).fit(x[:1500], y[:1500], each=lambda: fits.append(1))
    assert len(fits) == len(head.models) > 1  # the party's progress after every fit (network.RECV_TIMEOUT_S)
    head.choose(torch.zeros(500, dtype=torch.float64), x[1500:], torch.from_numpy(y[1500:]))
    assert head.weight == 1.0
    head.choose(torch.from_numpy(y[1500:]), x[1500:], torch.from_numpy(y[1500:]))
    assert head.weight == 0.0 and head.scores[0.0] == 0.0


def test_the_trees_read_the_own_block_where_observed_the_posterior_mean_and_the_holders():
    cfg = small("false-vfl", seed=1, head="network+trees")
    node, data = node_and_data(cfg, n=30, p=0.4)[:2]
    batch, a = data.batch(np.arange(data.n)), cfg.active_index
    with torch.no_grad():
        inputs = trees_inputs(node, batch, forward_rounds(node, batch, 4, Stage.PREDICT)).get()
        total = sum(node.posterior_contributions(batch).values())
        mean = latent_posterior(*total.split(cfg.h_dim, dim=-1), encoded_count(node, batch).get()).loc
    width = data.x[a].shape[1]
    seen = np.broadcast_to(data.held[a].numpy()[:, None] & (data.observed[a].numpy() if a in data.observed
                                                            else True), (data.n, width))
    assert (~seen).any() and seen.any()
    assert np.isnan(inputs[:, :width][~seen]).all()
    assert np.array_equal(inputs[:, :width][seen], data.x[a].numpy().astype(np.float64)[seen])
    assert np.allclose(inputs[:, width:width + cfg.h_dim], mean.numpy(), atol=1e-6)
    assert np.array_equal(inputs[:, -1], data.n_observed.get().numpy())
    assert head_features(batch.x[a], torch.from_numpy(seen.copy()), mean, batch.n_observed.get()).shape == inputs.shape


def test_training_fits_the_trees_after_stage_2_and_predictions_blend_them(capsys):
    cfg = small("false-vfl", seed=2, head="network+trees")
    node, data = node_and_data(cfg, n=80, n_labeled=50)[:2]
    validation = node_and_data(cfg, n=40, n_labeled=40)[1]
    trained = fit(node, data, progress=True, validation=validation)
    # with bars, a line says what follows the last one (a trial saw 20 s of silence there)
    assert capsys.readouterr().err.count("fitting the active party's trees: one forward pass over the labeled "
                                         "training records, then up to 5 models\n") == 1
    role = node.active.get()
    assert trained.trees["rows"] == 50 and set(trained.trees["validation"]) == {str(w) for w in WEIGHTS}
    assert role.trees.weight in WEIGHTS and trained.trees["weight"] == role.trees.weight
    role.trees.weight = 0.5  # whatever validation chose: both parts must show in the blend
    blended = predict_split(node, validation).get()
    weight, role.trees = role.trees.weight, None
    network = predict_split(node, validation).get()
    # the same trees from an independent pass: the labeled rows' inputs and labels, the validation rows' inputs
    refit = TreesHead("classification", 3, cfg.seed).fit(inputs_of(node, data, data.labeled_index),
                                                         data.y.get()[data.labeled_index].numpy())
    trees = refit.predict(inputs_of(node, validation))
    expected = (1 - weight) * network.double() + weight * trees
    assert torch.allclose(blended.double(), expected, atol=1e-5)
    assert not torch.allclose(blended.double(), network.double(), atol=1e-3)  # the trees moved it


def inputs_of(node, data, rows=None) -> np.ndarray:
    """The trees' inputs of `rows` from a fresh pass (the frozen model and restarted noise give the same)."""
    rows, size = np.arange(data.n) if rows is None else rows, node.cfg.eval_batch_size
    node.restart_noise(Stage.PREDICT)
    out = []
    with torch.no_grad():
        for start in range(0, len(rows), size):
            batch = data.batch(rows[start:start + size])
            weighted = forward_rounds(node, batch, node.cfg.predict_samples, Stage.PREDICT)
            out.append(trees_inputs(node, batch, weighted).get())
    return np.concatenate(out)


def test_predict_refits_the_same_trees_from_the_saved_rows_and_a_missing_file_is_one_error(tmp_path):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(400, 4)), rng.normal(size=400)
    x[:, 0] = rng.integers(0, 5, 400)  # a category code: the trees split sets of its values
    x[rng.random(x.shape) < 0.2] = np.nan
    y += np.isin(x[:, 0], [1, 3])
    categorical = np.array([True, False, False, False])
    head = TreesHead("regression", 1, seed=7, categorical=categorical).fit(x, y)
    head.weight = 0.75
    head.save(tmp_path)
    loaded = TreesHead.load(tmp_path, "regression", 1, seed=7, groups=((0, 5),))
    assert loaded.weight == 0.75 and np.array_equal(loaded.categorical, categorical)
    assert torch.equal(loaded.predict(x), head.predict(x))
    assert all(m.is_categorical_[0] for m in loaded.models)
    assert (tmp_path / "trees.npz").stat().st_mode & 0o077 == 0  # the active party's own rows: owner only
    with pytest.raises(InputError, match="trees.npz is missing"):
        TreesHead.load(tmp_path / "elsewhere", "regression", 1, seed=7, groups=())


def test_trees_saved_before_category_codes_load_only_where_the_model_has_no_categorical_column(tmp_path):
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(300, 3)), rng.normal(size=300)
    np.savez(tmp_path / "trees.npz", features=x, y=y, weight=np.float64(0.5))  # an earlier version's file
    loaded = TreesHead.load(tmp_path, "regression", 1, seed=1, groups=())
    assert not loaded.categorical.any() and loaded.weight == 0.5
    with pytest.raises(InputError, match="another layout than this model's; train again"):
        TreesHead.load(tmp_path, "regression", 1, seed=1, groups=((0, 2),))
    np.savez(tmp_path / "trees.npz", features=x, y=y, weight=np.float64(0.5), categorical=np.zeros(5, bool))
    with pytest.raises(InputError, match="another layout"):
        TreesHead.load(tmp_path, "regression", 1, seed=1, groups=())


def test_the_trees_pass_counts_as_one_more_release_of_each_training_row():
    plain = small("false-vfl")
    with_trees = small("false-vfl", head="network+trees")
    assert releases_per_row(with_trees) == releases_per_row(plain) + 2  # a prediction pass: 2 summed rounds


def test_train_says_what_share_the_trees_took_and_the_scores_it_was_chosen_by():
    from falsevfl_secure.federation.quality import trees_lines

    record = {"weight": 0.75, "validation": {"0.0": 0.5, "0.25": 0.45, "0.5": 0.41, "0.75": 0.4, "1.0": 0.43},
              "rows": 300, "trees": 61}
    line, = trees_lines(record)
    assert line.startswith("trees: 61 trees on 300 labeled records take 0.75 of the blend")
    assert "validation loss 0.4000" in line and "discriminator alone 0.5000" in line and "trees alone 0.4300" in line
    assert trees_lines(None) == [] and "no validation records" in trees_lines({**record, "validation": {}})[0]
    assert trees_lines({**record, "models": 5})[0].startswith("trees: 61 trees in 5 averaged models on 300")
    # the metric is named (a trial read a standardised RMSE next to the raw one, unlabelled)
    assert "validation RMSE in the target's standard deviations 0.4000" in trees_lines(
        {**record, "metric": "rmse_standardised"})[0]
    assert "validation log loss 0.4000" in trees_lines({**record, "metric": "log_loss"})[0]


def test_the_trees_predict_the_mean_of_models_stopped_on_different_tenths():
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 4))
    y = x[:, 0] * x[:, 1] + 0.1 * rng.normal(size=400)
    head = TreesHead("regression", 1, seed=11).fit(x, y)
    alone = [HistGradientBoostingRegressor(max_iter=MAX_ITER, early_stopping=True, random_state=11 + i).fit(x, y)
             for i in range(BAG)]
    assert len({m.n_iter_ for m in alone}) > 1  # the tenths differ, so the models do
    assert np.allclose(head.predict(x[:50]).numpy(), np.mean([m.predict(x[:50]) for m in alone], axis=0))
    assert head.record()["models"] == BAG and head.record()["trees"] == sum(m.n_iter_ for m in alone)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(5, 80), n_classes=st.integers(2, 10))
def test_trees_fit_rare_classes_and_few_rows_where_early_stopping_cannot_stratify(seed, n, n_classes):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    y[0] = n_classes - 1  # a class may have a single row
    head = TreesHead("classification", n_classes + 1, seed=0).fit(rng.normal(size=(n, 3)), y)
    p = head.predict(rng.normal(size=(7, 3))).numpy()
    assert p.shape == (7, n_classes + 1) and np.allclose(p.sum(axis=1), 1.0)
    assert (p[:, np.setdiff1d(np.arange(n_classes + 1), y)] == 0).all()  # a class never seen gets 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), b=st.integers(1, 30), d=st.integers(1, 6))
def test_the_trees_see_nan_exactly_where_the_active_party_observes_no_value(seed, b, d):
    g = torch.Generator().manual_seed(seed)  # test data only
    x, loc = torch.randn(b, d, generator=g), torch.randn(b, 3, generator=g)
    seen = torch.rand(b, d, generator=g) < 0.6
    n_observed = torch.randint(0, 4, (b,), generator=g)
    out = head_features(x, seen, loc, n_observed)
    assert out.shape == (b, d + 4) and out.dtype == np.float64
    assert np.array_equal(np.isnan(out[:, :d]), ~seen.numpy())
    assert np.array_equal(out[:, :d][seen.numpy()], x.double().numpy()[seen.numpy()])
    assert np.array_equal(out[:, d:d + 3], loc.double().numpy()) and np.array_equal(out[:, -1], n_observed.numpy())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), b=st.integers(1, 30), widths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       numeric=st.integers(0, 3))
def test_a_categorical_column_reaches_the_trees_as_its_category_code(seed, b, widths, numeric):
    rng = np.random.default_rng(seed)
    cells, groups, codes = [], [], []
    for width in widths:  # one-hot groups, then numeric cells
        code = rng.integers(0, width, b)
        cells.append(np.eye(width)[code])
        groups.append((sum(c.shape[1] for c in cells[:-1]), sum(c.shape[1] for c in cells)))
        codes.append(code)
    cells.append(rng.normal(size=(b, numeric)))
    x = np.hstack(cells)
    seen = np.ones_like(x, dtype=bool)
    seen[rng.random(b) < 0.3] = False  # records the active party does not hold
    held = seen[:, 0].copy()
    known = [held.copy() for _ in groups]
    for j, (start, stop) in enumerate(groups):
        missing = rng.random(b) < 0.2  # a missing cell in a held record: unobserved, or filled with shares
        seen[missing, start:stop] = rng.random() < 0.5
        x[missing, start:stop] = rng.dirichlet(np.ones(stop - start), missing.sum()) if stop - start > 1 else 0.0
        unseen = rng.random(b) < 0.1  # a category the encoding never saw: every cell 0
        x[unseen, start:stop] = 0.0
        known[j] &= ~missing & ~unseen
    out = head_features(torch.from_numpy(x), torch.from_numpy(seen), torch.zeros(b, 2), torch.ones(b), tuple(groups))
    g = len(groups)
    assert out.shape == (b, g + numeric + 3)
    for j, code in enumerate(codes):
        assert np.array_equal(np.isnan(out[:, j]), ~known[j])  # a code exactly where one category is known
        assert np.array_equal(out[known[j], j], code[known[j]])
    assert np.array_equal(out[held, g:g + numeric], x[held, x.shape[1] - numeric:])
    mask = categorical_mask(tuple(groups) + ((0, MAX_CATEGORIES + 1),), g + 1 + numeric + 3)
    assert mask[:g].all() and not mask[g:].any()  # a column past the trees' categories is read as a number


def test_trees_fitted_on_a_single_class_predict_it_with_certainty():
    head = TreesHead("classification", 3, seed=0).fit(np.random.default_rng(0).normal(size=(6, 3)), np.full(6, 2))
    assert np.allclose(head.predict(np.zeros((2, 3))).numpy(), [[0, 0, 1], [0, 0, 1]])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 60), n_classes=st.integers(2, 5))
def test_the_class_weighted_selection_loss_is_scikit_learns_log_loss_with_balanced_sample_weights(seed, n, n_classes):
    # class_weight = "balanced" (a trial): validation chooses the epoch and the blend by the loss stage 2 trains on
    from sklearn.metrics import log_loss
    from sklearn.utils.class_weight import compute_sample_weight

    from falsevfl_secure.metrics import selection_loss
    from falsevfl_secure.model.active import balanced_weights

    rng = np.random.default_rng(seed)
    y = np.arange(n) % n_classes if n >= n_classes else rng.integers(0, n_classes, n)
    p = rng.dirichlet(np.ones(n_classes), size=n)
    weights = balanced_weights(torch.from_numpy(y), n_classes)
    got = selection_loss("classification", torch.from_numpy(p), torch.from_numpy(y), weights)
    want = log_loss(y, p, labels=np.arange(n_classes), sample_weight=compute_sample_weight("balanced", y))
    assert got == pytest.approx(want, rel=1e-6)  # (the weights are float32, as stage 2 applies them)
    assert selection_loss("classification", torch.from_numpy(p), torch.from_numpy(y)) == \
        pytest.approx(log_loss(y, p, labels=np.arange(n_classes)), rel=1e-9)


def test_balanced_trees_weigh_the_rare_class_and_predict_refits_them_so(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1200, 3))
    y = (x[:, 0] + rng.normal(size=1200) > 1.9).astype(int)  # about 6 % positive
    plain, balanced = (TreesHead("classification", 2, seed=1, balanced=b).fit(x, y) for b in (False, True))
    assert balanced.predict(x)[:, 1].mean() > 2 * plain.predict(x)[:, 1].mean()  # the rare class weighs as much
    balanced.save(tmp_path)
    loaded = TreesHead.load(tmp_path, "classification", 2, seed=1, groups=())
    assert loaded.balanced and torch.equal(loaded.predict(x), balanced.predict(x))
    assert balanced.record()["metric"] == "log_loss_balanced" and plain.record()["metric"] == "log_loss"
