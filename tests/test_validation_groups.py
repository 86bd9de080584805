"""[federation] validation_group: the validation records are whole groups of the active party's columns
(records of one day, one branch), so the validation score reads like a score on groups never trained on."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.data.tables import PartyTable
from falsevfl_secure.errors import InputError
from falsevfl_secure.federation.aligned import GROUPS, Policy, _hold_out, group_codes, validation_groups
from falsevfl_secure.randomness import PublicStream, RoleSecret, public_rng


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 400), n_groups=st.integers(1, 40),
       fraction=st.sampled_from([0.05, 0.1, 0.2, 0.5]))
def test_whole_groups_are_held_out_up_to_the_share_asked_for(seed, n, n_groups, fraction):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, 2 * n) * 3 + 5  # any integers name the groups
    rows = np.sort(rng.choice(2 * n, n, replace=False))
    draw = RoleSecret.for_tests(seed, 0)
    policy = Policy(validation_fraction=fraction, seed=seed, groups=groups, group_draw=draw.stream(GROUPS))
    train, held = _hold_out(rows, policy)
    assert np.array_equal(np.sort(np.concatenate([train, held])), rows)
    assert not np.intersect1d(groups[train], groups[held]).size  # no group on both sides
    count = min(int(round(fraction * n)), n - 1)
    assert held.size <= count and train.size >= 1
    names, sizes = np.unique(groups[train], return_counts=True)
    assert (sizes > count - held.size).all()  # every group left to train on did not fit any more
    again = _hold_out(rows, Policy(validation_fraction=fraction, groups=groups, group_draw=draw.stream(GROUPS)))[1]
    assert np.array_equal(held, again)  # the same stream holds out the same records


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


def _held_groups(policy: Policy, rows: np.ndarray, groups: np.ndarray) -> set:
    return set(groups[_hold_out(rows, policy)[1]].tolist())


def test_a_passive_party_cannot_tell_which_groups_were_held_out(monkeypatch, attacked):
    """Every party learns the held-out positions. A passive party that knows the groups' values (a year's
    days) and every public input tries to name the held-out days: it does against a build whose active party
    derives its secret from the public seed (the package's own draw, only its entropy weakened), and guesses
    at chance against the shipped one, which draws it from the operating system's entropy."""
    from falsevfl_secure.federation import aligned

    rng = np.random.default_rng(0)
    groups = np.sort(rng.integers(1, 366, 20_000))  # day of the year, the active party's column
    rows = np.arange(groups.size)

    def attacker(seed: int) -> set:  # all public: the seed, the fraction, the values 1..365 (all present)
        guessed = RoleSecret.for_tests(seed, -1).stream(GROUPS)
        return _held_groups(Policy(validation_fraction=0.1, seed=seed, groups=groups, group_draw=guessed), rows, groups)

    def held(seed: int, weak: bool) -> set:  # the active party's draw, through the package's default path
        with monkeypatch.context() as patch:
            if weak:
                patch.setattr(aligned.RoleSecret, "fresh", classmethod(lambda cls: cls.for_tests(seed, -1)))
            return _held_groups(Policy(validation_fraction=0.1, seed=seed, groups=groups), rows, groups)

    hits_weak, hits_shipped, chance = [], [], []
    for seed in range(5):
        guess, actual_weak, actual = attacker(seed), held(seed, True), held(seed, False)
        hits_weak.append(len(guess & actual_weak) / len(actual_weak))
        hits_shipped.append(len(guess & actual) / len(actual))
        chance.append(len(guess) / 365)
    attacked("held-out validation groups (passive)", "weakened: secret from the public seed",
             f"{min(hits_weak):.1%} of the held-out days named (5 seeds)")
    attacked("held-out validation groups (passive)", "shipped",
             f"{np.mean(hits_shipped):.1%} of the held-out days named, chance {np.mean(chance):.1%}")
    assert min(hits_weak) == 1.0  # the weakened build: every held-out day named
    assert np.mean(hits_shipped) < 2 * np.mean(chance) + 0.05  # shipped: about a tenth, as by chance
    public = public_rng(0, PublicStream.VALIDATION).permutation(365)  # nor is the old public order it
    assert len({int(d) + 1 for d in public[:36]} & _held_groups(Policy(0.0, 0.1, 0, groups=groups), rows, groups)) < 18


def test_few_groups_are_refused_before_any_run(tmp_path):
    n = 200
    table = PartyTable("bank", Path("bank.csv"), tuple(map(str, range(n))), ("branch",),
                       np.full((n, 1), np.nan, np.float32), np.ones(n, bool), None,
                       text={"branch": tuple(f"b{i % 12}" for i in range(n))})
    fed = SimpleNamespace(validation_group=("branch",), validation_fraction=0.1, path=Path("federation.toml"))
    with pytest.raises(InputError, match="fall in 12 groups of branch; holding out whole groups needs at least 20"):
        validation_groups(table, np.arange(n), fed)
    assert validation_groups(table, np.arange(n), SimpleNamespace(**{**vars(fed), "validation_fraction": 0.2})) \
        is not None  # 12 groups suffice for a fifth
