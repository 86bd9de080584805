"""A party's encoding released with DP under its budget (falsevfl_secure/data/private_encoding.py): the two
mechanisms' sensitivity, the category threshold's delta against the sampler's exact pmf, the statistics it
gives against the clear ones, the ledger that charges it, and the attacks of threat_models/dp.toml on it: one
row's membership from the standardisation and a category one row holds."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_privacy import _worst_excess, secrets_bytes

from falsevfl_secure import privacy
from falsevfl_secure.config import PrivacyConfig
from falsevfl_secure.data import private_encoding
from falsevfl_secure.data.encoding import OTHER, encode, fit_encoding
from falsevfl_secure.data.private_encoding import (
    EDGES,
    GRID,
    EncodingRelease,
    bin_counts,
    category_threshold,
    moment_sums,
    private_scaler,
)
from falsevfl_secure.data.private_encoding import (
    private_encoding as release_encoding,
)
from falsevfl_secure.data.tables import PartyTable
from falsevfl_secure.methods import make_config
from falsevfl_secure.randomness import KeyStream
from falsevfl_secure.secure.discrete_gaussian import pmf

MAGNITUDE = st.floats(-4, 11)  # log10 of a column's scale: the public bins span 1e-4 .. 1e12


def _table(values: np.ndarray, kinds: list[str] | None = None) -> PartyTable:
    """A party's table of one numeric column `v` (NaN: missing) and, given `kinds`, one categorical `c`."""
    n = values.size
    columns, x, text = ("v",), values.reshape(-1, 1), {}
    if kinds is not None:
        columns, x, text = ("v", "c"), np.stack([values, np.full(n, np.nan)], axis=1), {"c": tuple(kinds)}
    return PartyTable("bank", Path("bank.csv"), tuple(map(str, range(n))), columns, x.astype(np.float32),
                      np.ones(n, bool), None, text=text)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 60), d=st.integers(1, 5), magnitude=MAGNITUDE,
       spread=st.floats(0.0, 3.0), missing=st.floats(0.0, 0.9))
def test_one_row_moves_the_counts_by_sqrt_columns_and_the_sums_by_sqrt_3_columns_grid(seed, n, d, magnitude, spread,
                                                                                       missing):
    # The sensitivity each mechanism's noise is sized for: adding a row (any values, any missing cells, up to the
    # bins' ends and beyond) moves the counts by at most sqrt(d) and the sums by at most sqrt(3 d) GRID in L2.
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 10**spread, (n + 1, d)) * 10**magnitude * rng.choice([-1, 1], (n + 1, d))
    x[-1] *= 10 ** rng.uniform(-3, 3, d)  # the added row: anywhere
    observed = rng.random((n + 1, d)) >= missing
    low = np.sort(rng.choice(EDGES, (2, d)), axis=0)
    low, high = low[0], np.where(low[1] > low[0], low[1], low[0] + 1)
    counts = bin_counts(x, observed) - bin_counts(x[:-1], observed[:-1])
    sums = moment_sums(x, observed, low, high) - moment_sums(x[:-1], observed[:-1], low, high)
    assert np.linalg.norm(counts) <= math.sqrt(observed[-1].sum()) + 1e-9
    assert np.linalg.norm(sums) <= math.sqrt(3 * d) * GRID + 1e-9
    assert (np.abs(sums) <= GRID).all()


@pytest.mark.parametrize("var,columns", [(40, 1), (900, 12), (25_000, 3)])
def test_a_category_one_row_holds_clears_the_threshold_with_at_most_delta(var, columns):
    # Independent truth: the discrete Gaussian's exact pmf (mpmath), summed over the noise that would lift a
    # count of 1 to the threshold, in each of `columns` columns.
    delta = 1e-7
    threshold = category_threshold(var, delta, columns)
    start = math.ceil(threshold - 1)
    tail = float(pmf(var, np.arange(start, start + int(40 * math.sqrt(var)))).sum())
    assert columns * tail <= delta
    assert columns * tail > delta / 50  # and not far above what delta needs (the bound is tight to a few steps)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), magnitude=MAGNITUDE, centred=st.booleans(), d=st.integers(1, 4))
def test_the_released_standardisation_puts_the_rows_near_mean_0_and_std_1(seed, magnitude, centred, d):
    # Against the clear statistics: normal columns of any scale the bins cover, centred at 0 or at 3 standard
    # deviations, 4,000 rows, a small multiplier: the standardised rows have mean within 0.25 and std in
    # [0.6, 1.4] (clipping the tails to the released range narrows them a little).
    rng = np.random.default_rng(seed)
    scale = 10**magnitude
    x = rng.normal(0 if centred else 3 * scale, scale, (4000, d))
    observed = rng.random(x.shape) > 0.2
    scaler = private_scaler(x, observed, 0.5, KeyStream(secrets_bytes()))
    z = scaler.transform(x)
    for j in range(d):
        column = z[observed[:, j], j]
        assert abs(column.mean()) < 0.25 and 0.6 < column.std() < 1.4, (j, scaler.mean[j], scaler.scale[j])


def test_a_two_valued_column_is_numeric_and_a_constant_one_standardises_near_0():
    values = np.where(np.random.default_rng(0).random(3000) < 0.3, 1.0, 0.0)
    encoding, release = release_encoding(_table(values), 1.0, 1e-6, KeyStream(secrets_bytes()))
    assert encoding.binary == () and encoding.kinds() == [("numeric", 0, 1)] and release.delta == 0.0
    assert fit_encoding(_table(values)).binary == ("v",)  # in clear it is read off the rows
    constant = private_scaler(np.full((3000, 1), 7.0), np.ones((3000, 1), bool), 1.0, KeyStream(secrets_bytes()))
    assert constant.scale[0] > 0 and abs(constant.transform(np.full((5, 1), 7.0))).max() < 1.0


def _membership(multiplier: float, trials: int) -> dict[bool, np.ndarray]:
    """The adversary knows every other row and the target (an outlier far past them) and reads the released
    centre: present or not (dp.toml: adding one row must not move the others' inputs beyond the budget)."""
    rest = np.random.default_rng(0).normal(size=(300, 1))
    scores = {}
    for present in (True, False):
        x = np.vstack([rest, [[1000.0]]]) if present else rest
        stream = KeyStream(secrets_bytes())
        scores[present] = np.array([private_scaler(x, np.ones(x.shape, bool), multiplier, stream).mean[0]
                                    for _ in range(trials)])
    return scores


def test_one_rows_membership_from_the_released_standardisation_stays_inside_the_encodings_region(attacked):
    # The encoding released at multiplier z spends two Gaussian releases: here z is set so that the release alone
    # is at epsilon 1 (delta 1e-5); the attacker's best threshold on the centre stays inside that region.
    epsilon, delta = 1.0, 1e-5
    clear = [fit_encoding(_table(np.append(np.random.default_rng(0).normal(size=300), v))).scaler.mean[0]
             for v in (1000.0,)] + [fit_encoding(_table(np.random.default_rng(0).normal(size=300))).scaler.mean[0]]
    assert clear[0] - clear[1] > 3  # the weakened build, fitted in clear: the row moves the centre by 3.3
    z = privacy.calibrate(epsilon, private_encoding.RELEASES, delta)
    shipped = _worst_excess(_membership(z, 1500), epsilon, delta)
    attacked("one row's membership from the party's encoding (dp)", "weakened: fitted in clear",
             f"the row moves the centre by {clear[0] - clear[1]:.2f}: always told")
    attacked("one row's membership from the party's encoding (dp)", "shipped: released with DP (epsilon 1)",
             f"worst TPR - (e^eps FPR + delta) = {shipped:.3f} (<= 0: inside)")
    assert shipped <= 0.0
    assert _worst_excess(_membership(z * 0.05, 1500), epsilon, delta) > 0.0  # at 1/20 of the noise it leaves


def test_a_category_one_row_holds_is_not_released(attacked):
    rng = np.random.default_rng(1)
    values, kinds = rng.normal(size=2000), [f"k{i}" for i in rng.integers(0, 3, 2000)]
    rare = _table(np.append(values, 0.0), kinds + ["rare"])
    assert "rare" in fit_encoding(rare).categories["c"]  # weakened: in clear it adds an input column
    z, trials = 1.0, 200  # a small multiplier: the common categories hold ~670 rows, the threshold is ~8 rows
    released = [release_encoding(rare, z, 1e-6, KeyStream(secrets_bytes())) for _ in range(trials)]
    kept = sum("rare" in encoding.categories["c"] for encoding, _ in released)
    attacked("a category one row holds (dp)", "weakened: fitted in clear", "released in 1 of 1 fits")
    attacked("a category one row holds (dp)", "shipped: noisy count past a threshold",
             f"released in {kept} of {trials} fits (threshold {released[0][1].threshold:.1f} rows, delta 1e-6)")
    assert kept == 0 and all(set(e.categories["c"]) == {"k0", "k1", "k2", OTHER} for e, _ in released)
    encoding = released[0][0]
    shares = dict(zip(encoding.categories["c"], encoding.shares["c"], strict=True))
    assert sum(shares.values()) == pytest.approx(1.0) and shares.pop(OTHER) == 0 and min(shares.values()) > 0.25
    block = encode(rare, encoding)  # the rare value: observed in the OTHER cell, so the row stays held
    assert block.unseen["c"][0] == 1 and block.x[-1, 1 + encoding.categories["c"].index(OTHER)] == 1.0


def test_which_rows_a_party_holds_does_not_depend_on_the_release():
    # Review finding: a row whose only value was a category the threshold dropped read as not held, so the party
    # left its ID out of the alignment: a disclosure of the row's value through the release, uncounted. Every
    # categorical column now has the OTHER cell, whatever the rows; a weakened build without it (a dropped
    # category unobserved, as an unseen one) leaves the row out.
    rng = np.random.default_rng(3)
    kinds = [f"k{i}" for i in rng.integers(0, 3, 1000)] + ["rare"]
    values = np.append(rng.normal(size=1000), np.nan)  # the last row holds only its rare category
    table = _table(values, kinds)
    encoding, _ = release_encoding(table, 1.0, 1e-6, KeyStream(secrets_bytes()))
    block = encode(table, encoding)
    assert table.held[-1] and block.held[-1] and (block.held == table.held).all()
    weak = replace(encoding, categories={"c": ("k0", "k1", "k2")}, shares={"c": (1 / 3,) * 3}, private=False)
    assert not encode(table, weak).held[-1]


def test_a_column_whose_every_category_is_rare_encodes_every_row_in_the_other_cell():
    table = _table(np.zeros(40), [f"k{i}" for i in range(40)])
    encoding, release = release_encoding(table, 1.0, 1e-6, KeyStream(secrets_bytes()))
    assert encoding.categories["c"] == (OTHER,) and release.dropped == 40
    assert encode(table, encoding).observed[:, 1].all()


def test_each_mechanism_is_noised_for_its_sensitivity(monkeypatch):
    # Review finding: wrongly sized noise passed every other test here. Independent truth, for d numeric and c
    # categorical columns at multiplier 10: mechanism 1 (every bin and category count) at variance 100 (d + c),
    # mechanism 2 at 3 d 100 GRID^2 (the sensitivity test above bounds what one row moves).
    seen = []
    original = private_encoding.noisy

    def recording(counts, var, stream):
        seen.append((np.shape(counts), var))
        return original(counts, var, stream)

    monkeypatch.setattr(private_encoding, "noisy", recording)
    rng = np.random.default_rng(4)
    n, numeric = 500, rng.normal(size=(500, 3))
    table = PartyTable("bank", Path("bank.csv"), tuple(map(str, range(n))), ("a", "b", "c", "k", "m"),
                       np.hstack([numeric, np.full((n, 2), np.nan)]).astype(np.float32), np.ones(n, bool), None,
                       text={"k": tuple(f"x{i}" for i in rng.integers(0, 4, n)),
                             "m": tuple(f"y{i}" for i in rng.integers(0, 2, n))})
    release_encoding(table, 10.0, 1e-6, KeyStream(secrets_bytes()))
    assert seen == [((4,), 100 * 5), ((2,), 100 * 5), ((3, EDGES.size + 1), 100 * 5), ((3, 3), 3 * 3 * 100 * GRID**2)]
    # exact ceilings: the float 0.1 is a little above 1/10, so 100 x its square is just above 1 (floats say 1.0)
    assert private_encoding.variance(2.0, 3) == 12 and private_encoding.variance(0.1, 100) == 2


def test_training_charges_the_encoding_with_its_threshold_delta_and_calibration_leaves_room_for_it(tmp_path):
    # Independent truth: dp-accounting composing the schedule's releases and the encoding's two, at the delta the
    # threshold leaves.
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    cfg = make_config("digits", "quick", privacy=PrivacyConfig(epsilon=8.0, noise_multiplier=6.0))
    cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=4), train=replace(cfg.train, epochs=4))
    z_enc = privacy.encoding_multiplier(cfg.privacy)
    release = EncodingRelease(z_enc, delta=1e-7, threshold=50.0)
    privacy.charge_encoding(cfg, "lab", tmp_path, release)
    used, entry = privacy.charge_training(cfg, "lab", tmp_path, 1)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(6.0), used.releases)
    accountant.compose(dp_accounting.GaussianDpEvent(z_enc), 2)
    # the threshold: delta less its 1e-7, and epsilon more by -ln(1 - 1e-7)
    assert used.epsilon == pytest.approx(accountant.get_epsilon(cfg.privacy.delta - 1e-7) + 1e-7, rel=2e-3)
    ledger = privacy.read_ledger(tmp_path)
    assert ledger["earlier"] == [[z_enc, 2]] and ledger["threshold_delta"] == 1e-7 and ledger == entry
    privacy.charge_encoding(cfg, "lab", tmp_path, release)  # retraining: a new encoding, charged too
    again, _ = privacy.charge_training(cfg, "lab", tmp_path, 1)
    assert privacy.read_ledger(tmp_path)["threshold_delta"] == pytest.approx(2e-7) and again.epsilon > used.epsilon
    # the encoding's share: 1 / z_enc^2 x 2 is ENCODING_SHARE of the one release that spends the budget
    single = privacy.calibrate(8.0, 1, cfg.privacy.delta)
    assert 2 / z_enc**2 == pytest.approx(privacy.ENCODING_SHARE / single**2, rel=1e-5)
    calibrated = privacy.calibrate(8.0, 30, cfg.privacy.delta, ((z_enc, 2),))
    assert privacy.epsilon_of(calibrated, 30, cfg.privacy.delta, ((z_enc, 2),)) == pytest.approx(8.0, rel=2e-3)
    assert privacy.epsilon_of(calibrated, 30, cfg.privacy.delta, ((z_enc, 2),)) <= 8.0 * (1 + 1e-9)


def test_a_ledger_whose_thresholds_took_the_delta_refuses_any_more(tmp_path):
    from falsevfl_secure.errors import InputError

    cfg = make_config("digits", "quick", privacy=PrivacyConfig(epsilon=8.0, noise_multiplier=6.0, delta=1e-5))
    privacy.charge_encoding(cfg, "lab", tmp_path, EncodingRelease(50.0, delta=5e-6))
    with pytest.raises(InputError, match="category thresholds have taken 1e-05 of its delta"):
        privacy.charge_encoding(cfg, "lab", tmp_path, EncodingRelease(50.0, delta=5e-6))
    assert privacy.read_ledger(tmp_path)["threshold_delta"] == 5e-6  # refused before anything is recorded


def test_check_tells_the_party_which_categories_the_threshold_will_drop():
    from falsevfl_secure.data.private_encoding import preview, variance

    rng = np.random.default_rng(2)
    kinds = [f"k{i}" for i in rng.integers(0, 3, 2000)] + ["rare"] * 3
    table = _table(rng.normal(size=2003), kinds)
    threshold = category_threshold(variance(1.0, 2), 1e-6, 1)
    assert 3 < threshold < 600  # the three common ones hold ~670 rows each
    assert preview(table, 1.0, 1e-6).endswith(f"a category needs about {threshold:.0f} rows, 1 of 4 hold fewer and "
                                              "will mostly read as '(other)'")
    sparse = _table(np.zeros(40), [f"k{i}" for i in range(40)])
    assert preview(sparse, 1.0, 1e-6).endswith("every category of 'c' does: the column will carry next to nothing")


def test_a_released_encoding_is_reused_for_the_same_table_and_charged_once(tmp_path):
    # Review finding: every propose-clips run and every training drew (and paid for) a fresh encoding of the same
    # rows. The released one is kept in the party's model folder for the table it was drawn from.
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.inputs import RELEASED, read_training_table
    from falsevfl_secure.federation.tables_demo import Spec, write_federation

    written = write_federation(tmp_path, Spec(categorical=True, messy=False))
    written.path.write_text(written.path.read_text() + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 10.0\n")
    fed = load_federation(written.path)
    first, again = (read_training_table(fed, "lab", private=True) for _ in range(2))
    ledger = privacy.read_ledger(fed.party("lab").model_dir)
    assert first.encoding.to_dict() == again.encoding.to_dict() and again.release.reused and not first.release.reused
    assert len(ledger["encodings"]) == 1 and first.encoding.private
    table = fed.own("lab").train
    table.write_text("\n".join(table.read_text().splitlines()[:-1]) + "\n")  # one row fewer: other rows, drawn again
    other = read_training_table(fed, "lab", private=True)
    assert not other.release.reused and len(privacy.read_ledger(fed.party("lab").model_dir)["encodings"]) == 2
    (fed.party("lab").model_dir / RELEASED).write_text("{not json")  # unreadable: drawn and charged afresh
    assert not read_training_table(fed, "lab", private=True).release.reused
    assert read_training_table(fed, "lab").release is None  # `check`: in clear, nothing drawn or charged


def test_a_kept_encoding_is_charged_again_to_a_ledger_that_no_longer_counts_it(tmp_path):
    # Privacy review finding: a ledger deleted to start afresh, the kept encoding reused "charged then", and the
    # epsilon `privacy` reported left it out (3.25 where 4.04 had been spent). Its values are reused (no new
    # draw), its release is counted again.
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.inputs import read_training_table
    from falsevfl_secure.federation.tables_demo import Spec, write_federation

    written = write_federation(tmp_path, Spec(categorical=True, messy=False))
    written.path.write_text(written.path.read_text() + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 10.0\n")
    fed = load_federation(written.path)
    first = read_training_table(fed, "lab", private=True)
    ledger = fed.party("lab").model_dir / privacy.LEDGER
    charged = privacy.read_ledger(ledger.parent)
    ledger.unlink()
    again = read_training_table(fed, "lab", private=True)
    assert again.encoding.to_dict() == first.encoding.to_dict() and not again.release.reused
    assert "charged)" in again.release.line("lab")
    assert privacy.read_ledger(ledger.parent) == charged  # counted as when it was drawn
    assert read_training_table(fed, "lab", private=True).release.reused  # and then not again


def test_the_thresholds_probability_is_taken_from_delta_and_added_to_epsilon():
    # Review finding: a build without either part passed every budget test (p was 1e-7 there). At p = 0.1 of a
    # delta of 0.2, both parts are far above the tolerance: delta_G = 0.1 and epsilon + ln(1 / 0.9).
    budget = PrivacyConfig(epsilon=100.0, delta=0.2)
    got = privacy.ledger_epsilon(3.0, 10, budget, "lab", 0.1, ((5.0, 2),))
    assert got == pytest.approx(privacy.epsilon_of(3.0, 10, 0.1, ((5.0, 2),)) + math.log(1 / 0.9), rel=1e-12)
    assert got > privacy.epsilon_of(3.0, 10, 0.2, ((5.0, 2),)) + 0.1


def _released(tmp_path, epsilon: float = 8.0):
    from falsevfl_secure.federation.tables_demo import Spec, write_federation

    written = write_federation(tmp_path, Spec(categorical=True, messy=False))
    text = written.path.read_text()
    written.path.write_text(text + f"\n[privacy]\nepsilon = {epsilon}\nnoise_multiplier = 10.0\n")
    return written.path, text


@pytest.mark.parametrize("spoil", ["private false", "private text", "multiplier text", "multiplier negative",
                                   "share nan", "nested", "other budget"])
def test_a_kept_encoding_is_reused_only_as_it_was_written_and_at_the_same_budget(tmp_path, spoil):
    # Review findings: a kept file was reused whatever budget it was drawn under (a refused run's encoding at
    # epsilon 0.5 served a run at epsilon 8, multiplier 31 instead of 2.7), and the loader took files no release
    # writes (no OTHER cell, "false" read as true, a text multiplier that failed after the training charge).
    import json

    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.inputs import RELEASED, read_training_table

    path, text = _released(tmp_path)
    fed = load_federation(path)
    kept = fed.party("lab").model_dir / RELEASED
    read_training_table(fed, "lab", private=True)
    record = json.loads(kept.read_text())
    if spoil == "private false":
        record["encoding"]["private"] = False
    elif spoil == "private text":
        record["encoding"]["private"] = "false"
    elif spoil == "multiplier text":
        record["release"]["multiplier"] = "2.7"
    elif spoil == "multiplier negative":
        record["release"]["multiplier"] = -record["release"]["multiplier"]
    elif spoil == "share nan":
        record["encoding"]["shares"]["region"][0] = float("nan")
    elif spoil == "other budget":
        path.write_text(text + "\n[privacy]\nepsilon = 6.0\nnoise_multiplier = 10.0\n")
        fed = load_federation(path)
    kept.write_text("[" * 100_000 + "]" * 100_000 if spoil == "nested" else json.dumps(record))
    again = read_training_table(fed, "lab", private=True)
    assert not again.release.reused and again.encoding.private  # drawn afresh, and charged
    assert len(privacy.read_ledger(fed.party("lab").model_dir)["encodings"]) == 2


def test_what_fails_on_the_rows_alone_fails_before_the_encoding_is_charged(tmp_path):
    # Review finding: a column with no value was refused after the charge, so each try cost a tenth of the budget.
    from falsevfl_secure.data.errors import DataError
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.inputs import read_training_table

    path, _ = _released(tmp_path)
    fed = load_federation(path)
    table = fed.own("lab").train
    lines = table.read_text().splitlines()
    header = lines[0].split(",")
    blank = next(i for i, name in enumerate(header) if name not in ("id", "region") and not name.endswith("_id"))
    table.write_text("\n".join([lines[0], *(",".join("" if i == blank else c for i, c in enumerate(line.split(",")))
                                            for line in lines[1:])]) + "\n")
    for _ in range(2):
        with pytest.raises(DataError, match="no cell of the column holds a value"):
            read_training_table(fed, "lab", private=True)
    assert privacy.read_ledger(fed.party("lab").model_dir) == {}


def test_check_refuses_under_a_budget_a_block_training_would_refuse(tmp_path, monkeypatch):
    # Review finding: check sized the block without the '(other)' cells, so a table at the memory bound passed
    # check and failed at every train (after the charge, then; before it now).
    from falsevfl_secure.data import encoding as encoding_module
    from falsevfl_secure.federation.check import check_party
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.inputs import read_training_table

    path, _ = _released(tmp_path)
    fed = load_federation(path)
    clear = read_training_table(fed, "lab")
    monkeypatch.setattr(encoding_module, "MAX_CELLS", clear.table.n_rows * clear.encoding.width)  # clear fits
    result = check_party(fed, "lab", "check")
    assert any("encoded cells is more than" in error for error in result.errors), result.errors
    assert privacy.read_ledger(fed.party("lab").model_dir) == {}
