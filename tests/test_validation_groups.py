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
from falsevfl_secure.federation.aligned import Policy, _hold_out, group_codes, group_key, validation_groups
from falsevfl_secure.randomness import PublicStream, RoleSecret, public_rng
from falsevfl_secure.secure.identity import generate as generate_key


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 400), n_groups=st.integers(1, 40),
       fraction=st.sampled_from([0.05, 0.1, 0.2, 0.5]))
def test_whole_groups_are_held_out_up_to_the_share_asked_for(seed, n, n_groups, fraction):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, 2 * n) * 3 + 5  # any integers name the groups
    rows = np.sort(rng.choice(2 * n, n, replace=False))
    train, held = _hold_out(rows, Policy(validation_fraction=fraction, seed=seed, groups=groups))
    assert np.array_equal(np.sort(np.concatenate([train, held])), rows)
    assert not np.intersect1d(groups[train], groups[held]).size  # no group on both sides
    count = min(int(round(fraction * n)), n - 1)
    assert held.size <= count and train.size >= 1
    names, sizes = np.unique(groups[train], return_counts=True)
    assert (sizes > count - held.size).all()  # every group left to train on did not fit any more


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


def _days_table(days: np.ndarray) -> PartyTable:
    n = days.size
    return PartyTable("airline", Path("airline.csv"), tuple(map(str, range(n))), ("day",),
                      days.astype(np.float32).reshape(-1, 1), np.ones(n, bool), None)


def _held_days(table: PartyTable, key: bytes | None) -> set:
    """The days the active party holds out, through the package's path: its groups named under `key`."""
    days = table.x[:, 0].astype(int)
    names = group_codes(table, ("day",), Path("federation.toml"), key)
    return set(days[_hold_out(np.arange(days.size), Policy(validation_fraction=0.1, groups=names))[1]].tolist())


def _guess(held: set, key: bytes) -> set:
    """The passive party's guess: the days in the order `key` names them, as many as were held out (the
    held-out positions make an estimate of that)."""
    names = group_codes(_days_table(np.arange(1, 366)), ("day",), Path("federation.toml"), key)
    return set((np.argsort(names) + 1)[:len(held)].tolist())


def test_a_passive_party_cannot_tell_which_groups_were_held_out(attacked):
    """Every party learns the held-out positions. A passive party that knows the groups' values (a year's
    days) and every public input (the seed, the active party's pinned public key) tries to name the held-out
    days: it does against builds whose active party derives its group key from the public seed or from its
    pin, and guesses at chance against the shipped one, whose key comes from its private identity key
    (`group_key`), which no other party holds."""
    import hashlib

    from falsevfl_secure.secure.identity import public_bytes

    rng = np.random.default_rng(0)
    table = _days_table(np.sort(rng.integers(1, 366, 20_000)))  # day of the year, the active party's column
    hits = {"public seed": [], "pin": [], "shipped": []}
    chance = []
    for seed in range(5):
        identity = generate_key()
        weak = {"public seed": RoleSecret.for_tests(seed, -1).key,  # all public: the seed, the pin, the days
                "pin": hashlib.blake2b(public_bytes(identity), digest_size=32).digest()}
        for build, key in weak.items():
            held = _held_days(table, key)
            hits[build].append(len(_guess(held, key) & held) / len(held))
        held = _held_days(table, group_key(identity))
        best = max((_guess(held, key) for key in weak.values()), key=lambda guess: len(guess & held))
        hits["shipped"].append(len(best & held) / len(held))  # its better guess from either public key
        chance.append(len(best) / 365)
    for build in ("public seed", "pin"):
        attacked("held-out validation groups (passive)", f"weakened: group key from the {build}",
                 f"{min(hits[build]):.1%} of the held-out days named (5 seeds)")
        assert min(hits[build]) >= 0.9  # the held-out days named (the last in the order may not have fitted)
    attacked("held-out validation groups (passive)", "shipped",
             f"{np.mean(hits['shipped']):.1%} of the held-out days named, chance {np.mean(chance):.1%}")
    assert np.mean(hits["shipped"]) < 2 * np.mean(chance) + 0.05  # shipped: about a tenth, as by chance
    public = public_rng(0, PublicStream.VALIDATION).permutation(365)  # nor is the old public order it
    assert len({int(d) + 1 for d in public[:36]} & _held_days(table, group_key(generate_key()))) < 18


def test_runs_hold_out_the_same_groups_so_repeated_runs_tell_nothing_more(attacked):
    """A passive party sees the held-out positions of every run over the same tables (a retraining, a
    `--resume`) and groups the records by the runs that held them out: records that share a group always
    share that pattern. A build that ordered the groups afresh each run (the build before, review finding)
    gives 16 runs' patterns in which same-group pairs are many times more frequent than among records held out
    in one run; the shipped key is the same in every run (from the identity key), so 16 runs tell what one does."""
    rng = np.random.default_rng(1)
    days = rng.integers(1, 366, 20_000)
    table, identity = _days_table(days), generate_key()

    def purity(key_of_run) -> float:  # of the record pairs with one pattern over 16 runs, how many share a day
        runs = [np.isin(days, list(_held_days(table, key_of_run()))) for _ in range(16)]
        _, pattern = np.unique(np.stack(runs, axis=1), axis=0, return_inverse=True)
        pairs = np.unique(np.stack([pattern.reshape(-1), days], axis=1), axis=0, return_counts=True)
        same_day = float((pairs[1] * (pairs[1] - 1)).sum())
        per_pattern = np.bincount(pattern.reshape(-1)).astype(float)
        return same_day / float((per_pattern * (per_pattern - 1)).sum())

    fresh, shipped = purity(lambda: None), purity(lambda: group_key(identity))
    attacked("records that share a validation group (passive, 16 runs)", "weakened: a fresh order each run",
             f"{fresh:.1%} of pairs with one pattern share a day")
    attacked("records that share a validation group (passive, 16 runs)", "shipped",
             f"{shipped:.1%} of pairs with one pattern share a day (chance {1 / 365:.2%})")
    assert shipped < 0.01 and fresh > 5 * shipped


def test_a_group_keeps_its_name_whatever_else_the_table_holds():
    """One key names a day alike in a table of a year and in one of a month of it: a retraining on more records
    holds out the same days where they still fit."""
    key = group_key(generate_key())
    year, month = _days_table(np.arange(1, 366)), _days_table(np.arange(1, 32))
    names = group_codes(year, ("day",), Path("f.toml"), key)
    assert np.array_equal(group_codes(month, ("day",), Path("f.toml"), key), names[:31])
    assert np.unique(names).size == 365 and not np.array_equal(group_codes(year, ("day",), Path("f.toml")), names)


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
