"""The readings of the paper's protocol as options (issue 30): each checked against an independent
computation (LASER-VFL's batch formation, the step cap, PlugVFL's drop granularity, the rows a training
mechanism touches, FALSE-VFL's posterior under MIWAE's convention), and the defaults unchanged."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_methods import node_and_data, small

from falsevfl_secure.bounds import latent_posterior
from falsevfl_secure.config import PRESETS, Config, Stage
from falsevfl_secure.data import load_dataset, make_train_split
from falsevfl_secure.errors import InputError
from falsevfl_secure.methods import METHODS, make_config, method_for
from falsevfl_secure.methods.base import epoch_batches
from falsevfl_secure.methods.false_vfl_steps import encoded_count
from falsevfl_secure.methods.laser import grouped
from falsevfl_secure.randomness import PublicStream, public_rng
from falsevfl_secure.train import optimizers_for, run_stage, stage_batches


def readings(cfg: Config) -> dict:
    """Every setting and the method's own options, side by side."""
    return {**cfg.to_dict(), **cfg.options}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dataset", sorted(PRESETS))
def test_the_paper_preset_keeps_every_default_reading_and_paper_protocol_changes_only_the_stated_ones(method, dataset):
    paper = make_config(dataset, "paper", method=method)
    protocol = make_config(dataset, "paper-protocol", method=method)
    defaults = {name: option.default for name, option in METHODS[method].options.items()}
    assert paper.options == defaults and paper.mechanism_rows == "all" and paper.train.steps_per_epoch == 0
    changed = {k for k, v in readings(protocol).items() if readings(paper)[k] != v} - {"options"}
    expected = {"mechanism_rows"} | ({"plug_drop"} if method == "plugvfl" else set())
    assert changed == expected | ({"train"} if method == "laser" else set())
    if method == "laser":  # the paper's nominal step count: epochs x ceil(labeled rows / batch size)
        labeled = {"fashion-mnist": 1000, "digits": 400}.get(dataset, 500)
        assert protocol.train == replace(paper.train, steps_per_epoch=math.ceil(labeled / paper.train.batch_size))
    assert make_config("isolet", "paper-protocol", method="laser").train.steps_per_epoch * 200 == 1600


@pytest.mark.parametrize(("field", "value", "method"), [
    ("laser_batches", "plain", "vanilla"), ("plug_drop", "batch", "laser"), ("encode_missing", "zeros", "fedhssl"),
    ("laser_batches", "shuffled", "laser"), ("mechanism_rows", "unlabeled", "false-vfl")])
def test_an_option_of_another_method_or_an_unknown_reading_is_refused_by_name(field, value, method):
    with pytest.raises(InputError, match=field):
        make_config("digits", "quick", method=method, **{field: value})


# ---------------------------------------------------------------------------------------- LASER-VFL batches


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 120), parties=st.integers(2, 5), batch=st.integers(1, 20),
       p=st.floats(0.0, 0.9))
def test_grouped_full_batches_are_full_and_share_one_observed_set_and_leave_only_each_group_s_remainder(
        seed, n, parties, batch, p):
    generator = np.random.default_rng(seed)
    patterns = generator.random((n, parties)) >= p
    rows = np.sort(generator.choice(n, size=max(1, n // 2), replace=False))
    plan = grouped(rows, patterns, batch, public_rng(seed, PublicStream.BATCH_ORDER, 2, 0), full_only=True)
    used = np.concatenate(plan) if plan else np.zeros(0, dtype=np.int64)
    assert all(len(b) == batch and (patterns[b] == patterns[b[0]]).all() for b in plan)
    assert len(np.unique(used)) == len(used) and set(used.tolist()) <= set(rows.tolist())
    _, counts = np.unique(patterns[rows], axis=0, return_counts=True)
    assert len(used) == int((counts - counts % batch).sum())  # each group's full batches, no more


def test_laser_plain_batches_are_every_method_s_shuffle_and_the_step_cap_takes_the_plan_s_first():
    node, data, _ = node_and_data(small("laser", laser_batches="plain"), n=120, p=0.3, n_labeled=100)
    plan = node.method.plan(Stage.TRAIN, data, 2, 3, 8)
    expected = epoch_batches(np.asarray(data.labeled_index), 8, 3, Stage.TRAIN, 2)
    assert [b.tolist() for b in plan] == [b.tolist() for b in expected]
    for cap in (0, 3, 50):
        node.cfg = replace(node.cfg, train=replace(node.cfg.train, steps_per_epoch=cap))
        batches = stage_batches(node, data, Stage.TRAIN, 2)
        assert len(batches) == (min(cap, len(expected)) if cap else len(expected))
        for batch, rows in zip(batches, expected, strict=False):
            assert batch.size == len(rows)


def test_laser_trains_under_every_batch_formation():
    for batches in ("grouped", "grouped-full", "plain"):
        node, data, _ = node_and_data(small("laser", laser_batches=batches), n=120, p=0.3, n_labeled=100)
        losses = run_stage(node, data, Stage.TRAIN, optimizers_for(node, Stage.TRAIN), progress=False)
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses), (batches, losses)


# ---------------------------------------------------------------------------------------- PlugVFL drops


@pytest.mark.parametrize("drop", ["row", "batch"])
def test_plugvfl_drops_a_passive_party_per_row_or_per_batch_at_rate_one_half(drop):
    node, data, _ = node_and_data(small("plugvfl", plug_drop=drop), n=32, p=0.0)
    batch, active, draws = data.batch(np.arange(data.n)), node.cfg.active_index, 60
    passive = sorted(set(node.parties) - {active})
    dropped = {k: torch.stack([node.method.contribution(node, batch, k, training=True).eq(0).all(-1)
                               for _ in range(draws if k in passive else 5)]) for k in node.parties}  # (draws, rows)
    assert not dropped[active].any()
    for k in passive:
        whole = dropped[k].all(-1) | ~dropped[k].any(-1)  # each draw: the batch all dropped or all kept
        assert bool(whole.all()) == (drop == "batch")
        rate, trials = float(dropped[k].double().mean()), draws if drop == "batch" else draws * data.n
        assert abs(rate - 0.5) < 4 * math.sqrt(0.25 / trials), rate  # 4 standard deviations


# ---------------------------------------------------------------------------------------- mechanism rows


@pytest.mark.parametrize("mechanism", ["mcar:0.5", "mar1", "mnar:0.7"])
def test_mechanism_rows_labeled_leaves_every_unlabeled_row_whole_and_the_labeled_rows_as_they_were(mechanism):
    digits = load_dataset("digits", seed=0)
    every = make_train_split(digits, 4, mechanism, seed=1, n_labeled=200, n_aligned=40)
    labeled_only = make_train_split(digits, 4, mechanism, seed=1, n_labeled=200, n_aligned=40,
                                    mechanism_rows="labeled")
    emptied = 200 - int(every.labeled.sum())  # labeled rows the mechanism empties (the empty-row rule drops them)
    assert labeled_only.n == len(digits.y_train) - emptied and int(labeled_only.labeled.sum()) == 200 - emptied
    assert not labeled_only.missing[~labeled_only.labeled].any()
    assert every.missing[~every.labeled].mean() > 0.1  # the default does touch them
    kept = every.index[every.labeled]  # the same draws on the labeled rows
    assert np.array_equal(labeled_only.missing[np.isin(labeled_only.index, kept) & labeled_only.labeled],
                          every.missing[every.labeled])


# ---------------------------------------------------------------------------------------- encode_missing


@pytest.mark.parametrize("seed", [0, 1])
def test_encode_missing_zeros_is_the_posterior_of_every_party_with_missing_blocks_encoded_as_zeros(seed):
    """MIWAE's convention against its closed form: the mean of all K parties' means (a missing block's
    encoder output on zeros included) and the inverse of the sum of all K precisions."""
    cfg = small("false-vfl", seed=seed)
    results = {}
    for encode in ("skip", "zeros"):
        node, data, split = node_and_data(cfg.with_options(encode_missing=encode), n=40, p=0.4)
        batch = data.batch(np.arange(data.n))
        with torch.no_grad():
            total = sum(node.posterior_contributions(batch).values())
            count = encoded_count(node, batch).get()
            posterior = latent_posterior(*total.split(cfg.h_dim, dim=-1), count)
            terms = [node.parties[k].model.posterior_contribution(batch.x[k], torch.ones_like(batch.held[k]))
                     for k in node.parties]
        results[encode] = posterior
        if encode == "zeros":
            assert (count == cfg.parties).all() and float(batch.x[0][~batch.held[0]].abs().sum()) == 0
            mean, precision = torch.stack(terms).sum(0).split(cfg.h_dim, dim=-1)
            assert torch.allclose(posterior.loc, mean / cfg.parties, atol=1e-6)
            assert torch.allclose(posterior.scale, precision.rsqrt(), atol=1e-6)
    partial = torch.as_tensor(split.missing.any(axis=1))
    assert partial.any() and not torch.allclose(results["skip"].loc[partial], results["zeros"].loc[partial])
    assert torch.allclose(results["skip"].loc[~partial], results["zeros"].loc[~partial], atol=1e-6)
    # a party that left would still be counted in every posterior: such a run stops rather than go on
    assert method_for(cfg).survives_party_loss
    assert not method_for(cfg.with_options(encode_missing="zeros")).survives_party_loss


def test_a_method_without_a_schedule_for_the_preset_is_an_input_error_not_false_vfls(refused, monkeypatch):
    """A baseline given a preset it has no schedule for was trained on FALSE-VFL's schedule, silently."""
    monkeypatch.setattr(METHODS["vanilla"], "schedules", {"digits": {"paper": {}, "default": {}}})
    with pytest.raises(InputError, match="method 'vanilla' has no 'quick' schedule for digits"):
        make_config("digits", "quick", method="vanilla")
    refused("method schedule")
    monkeypatch.setattr(METHODS["vanilla"], "schedules", {})
    with pytest.raises(InputError, match="has no 'paper' schedule for digits .it has: none"):
        make_config("digits", "paper", method="vanilla")
    refused("method schedule")
