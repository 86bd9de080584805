"""[federation] validation_group: the validation records are whole groups of the active party's columns
(records of one day, one branch), so the validation score reads like a score on groups never trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.data.tables import PartyTable
from falsevfl_secure.federation.aligned import Policy, _hold_out, group_codes


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 400), n_groups=st.integers(1, 40),
       fraction=st.sampled_from([0.05, 0.1, 0.2, 0.5]))
def test_whole_groups_are_held_out_near_the_share_asked_for(seed, n, n_groups, fraction):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, 2 * n) * 3 + 5  # any integers name the groups
    rows = np.sort(rng.choice(2 * n, n, replace=False))
    policy = Policy(validation_fraction=fraction, seed=seed, groups=groups)
    train, held = _hold_out(rows, policy)
    assert np.array_equal(np.sort(np.concatenate([train, held])), rows)
    assert not np.intersect1d(groups[train], groups[held]).size  # no group on both sides
    present = np.unique(groups[rows])
    count = min(int(round(fraction * n)), n - 1)
    if present.size == 1 or count == 0:
        assert held.size == 0
        return
    assert train.size >= 1
    largest = np.unique(groups[rows], return_counts=True)[1].max()
    assert abs(held.size - count) <= largest  # within one group of the share
    again = _hold_out(rows, policy)[1]
    assert np.array_equal(held, again)  # a public draw: the same records every time


def test_without_groups_the_draw_is_the_row_by_row_one():
    rows = np.arange(0, 300, 2)
    train, held = _hold_out(rows, Policy(validation_fraction=0.1, seed=4))
    assert held.size == 15 and train.size == 135
    assert np.unique(held % 2).tolist() == [0]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 60), text_values=st.integers(1, 4),
       numbers=st.integers(1, 5), use=st.sampled_from([("t",), ("v",), ("t", "v"), ("v", "t")]))
def test_group_codes_name_each_combination_of_values_once(seed, n, text_values, numbers, use):
    rng = np.random.default_rng(seed)
    text = [None if rng.random() < 0.2 else f"c{rng.integers(text_values)}" for _ in range(n)]
    v = rng.integers(0, numbers, n).astype(np.float32)
    v[rng.random(n) < 0.2] = np.nan
    x = np.stack([np.full(n, np.nan, np.float32), v, rng.normal(size=n).astype(np.float32)], axis=1)
    table = PartyTable("bank", Path("bank.csv"), tuple(map(str, range(n))), ("t", "v", "w"), x,
                       np.ones(n, bool), None, text={"t": tuple(text)})
    codes = group_codes(table, use, Path("federation.toml"))
    # independent truth: pandas' grouping, with an empty cell a value of its own
    frame = pd.DataFrame({"t": pd.Series(text, dtype=object).fillna("<empty>"), "v": pd.Series(v).fillna(-1.0)})
    truth = frame.groupby(list(use), sort=False).ngroup().to_numpy()
    same = codes[:, None] == codes[None, :]
    assert np.array_equal(same, truth[:, None] == truth[None, :])
    assert group_codes(table, (), Path("federation.toml")) is None
