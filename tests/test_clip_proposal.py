"""A party's clip proposal (`federation propose-clips`, falsevfl_secure/clip_proposal.py): the norms it measures
on its own rows, the histograms it releases with noise from its own stream, the quantile read from them, its
ledger entry and the budget that composes it with training; and the membership attack on the release."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_privacy import _worst_excess, secrets_bytes

from falsevfl_secure import clip_proposal, privacy
from falsevfl_secure.clip_proposal import EDGES, NAMES, measure_norms, quantile, release, stand_in
from falsevfl_secure.config import PrivacyConfig, Stage
from falsevfl_secure.errors import InputError
from falsevfl_secure.federation.__main__ import main
from falsevfl_secure.methods import build_node, make_config
from falsevfl_secure.node import HostedData
from falsevfl_secure.placement import Active
from falsevfl_secure.randomness import KeyStream, RoleSecret
from falsevfl_secure.transport import LocalTransport

CFG = make_config("digits", "quick", privacy=PrivacyConfig(epsilon=8.0, noise_multiplier=6.0))


def _block(n: int = 300, width: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, width)).astype(np.float32), rng.random((n, width)) > 0.1


def test_the_posterior_norms_are_the_initial_encoders_rows_and_no_row_moves_another():
    # The DP argument: each row's norms are a function of that row (and the party's own draws) alone, so adding,
    # removing or changing one row moves one count per histogram. Independent truth: the same secret's initial
    # party model, called on the rows in the public batch order.
    x, observed = _block()
    secret = RoleSecret.for_tests(3, 0)
    secrets = {0: secret, 1: RoleSecret.for_tests(3, 1)}
    norms = measure_norms(CFG, x, observed, None, secrets)
    assert all(norms[name].shape == (len(x),) and (norms[name] > 0).all() for name in NAMES), norms
    run = stand_in(CFG, len(x))
    node = build_node(run, {0: x.shape[1], 1: 1}, 2, LocalTransport(2, 1), torch.device("cpu"), {0: secret})
    data = HostedData(len(x), {0: torch.from_numpy(x)}, {0: torch.ones(len(x), dtype=torch.bool)}, Active.absent(),
                      Active.absent(), np.arange(0))
    order = np.concatenate(node.method.plan(Stage.PRETRAIN, data, 0, run.seed, run.pretrain.batch_size))
    with torch.no_grad():
        expected = node.parties[0].model.posterior_contribution(
            torch.from_numpy(x[order]), torch.ones(len(x), dtype=torch.bool), torch.from_numpy(observed[order]))
    np.testing.assert_allclose(norms["posterior"], expected.double().norm(dim=1).numpy(), rtol=1e-5)
    changed = x.copy()
    changed[order[0]] = 40.0  # an outlier row, first in the order
    moved = measure_norms(CFG, changed, observed, None, secrets)
    for name in NAMES:
        assert moved[name][0] != pytest.approx(norms[name][0]), name
        np.testing.assert_allclose(moved[name][1:], norms[name][1:], rtol=1e-9, err_msg=name)


def _exact(monkeypatch) -> None:
    """A weakened build: the release's noise off."""
    monkeypatch.setattr(clip_proposal, "discrete_gaussian", lambda variance, n, stream: np.zeros(n, dtype=np.int64))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), q=st.floats(0.05, 0.95), scale=st.floats(-3.5, 3.5), n=st.integers(20, 2000))
def test_the_quantile_of_exact_counts_is_the_first_bin_edge_at_or_above_the_rows_quantile(seed, q, scale, n):
    values = np.exp(np.random.default_rng(seed).normal(scale * math.log(10), 1.5, size=n))
    with pytest.MonkeyPatch.context() as patch:
        _exact(patch)
        counts = release({name: values for name in NAMES}, 1.0, KeyStream(b"\0" * 32))
    proposed = quantile(counts["posterior"], q)
    truth = np.sort(values)[max(math.ceil(q * n) - 1, 0)]  # the smallest norm with a share q of rows at or below it
    assert proposed >= min(truth, EDGES[-1]) * (1 - 1e-12)
    assert proposed <= max(truth * 10 ** (1 / 8), EDGES[0]) * (1 + 1e-9)  # one bin (8 a decade) above at most


def test_each_count_carries_noise_of_twice_the_multiplier():
    values = {name: np.full(500, 1.0) for name in NAMES}
    exact = np.bincount(np.searchsorted(EDGES, values["posterior"]), minlength=len(EDGES) + 1)
    draws = np.concatenate([release(values, 5.0, KeyStream(secrets_bytes()))["posterior"] - exact for _ in range(60)])
    assert abs(draws.mean()) < 4 * 10 / math.sqrt(draws.size)
    assert draws.var() == pytest.approx((2 * 5.0) ** 2, rel=0.08)


def _membership(multiplier: float, trials: int = 4000) -> dict[bool, np.ndarray]:
    """The adversary knows every other row's norms and the target row's (an outlier in each histogram): its
    statistic is the released count of the target's bins less the known counts, summed over the histograms."""
    rest = np.exp(np.random.default_rng(0).normal(0, 0.5, size=200))
    target = 500.0  # alone in its bin
    known = np.bincount(np.searchsorted(EDGES, rest), minlength=len(EDGES) + 1)
    at = int(np.searchsorted(EDGES, target))
    scores = {}
    for present in (True, False):
        norms = np.append(rest, target) if present else rest
        stream = KeyStream(secrets_bytes())
        released = (release({n: norms for n in NAMES}, multiplier, stream) for _ in range(trials))
        scores[present] = np.array([sum(r[n][at] - known[at] for n in NAMES) for r in released], dtype=float)
    return scores


def test_a_membership_distinguisher_on_the_proposal_stays_inside_its_privacy_region(monkeypatch, attacked):
    epsilon, delta = 1.0, 1e-5
    multiplier = privacy.calibrate(epsilon, 1, delta)  # one release at epsilon 1
    with monkeypatch.context() as patch:
        _exact(patch)
        weak = _membership(multiplier, 200)
    assert (weak[True] == 4).all() and (weak[False] == 0).all()  # the exact histograms: the row is seen
    shipped = _membership(multiplier)
    excess = _worst_excess(shipped, epsilon, delta)
    attacked("membership of a row in a clip proposal (epsilon 1)", "shipped",
             f"worst TPR - (e^eps FPR + delta) = {excess:.3f} (<= 0: inside)")
    assert excess <= 0.0
    assert _worst_excess(_membership(multiplier * 0.2), epsilon, delta) > 0.0  # at 0.2 of the noise it leaves


def test_the_ledger_counts_each_proposal_and_training_composes_them(tmp_path):
    first = privacy.charge_proposal(CFG, "lab", tmp_path, 8.0)
    assert first == pytest.approx(privacy.epsilon_of(8.0, 1, CFG.privacy.delta), rel=1e-3)
    assert privacy.charge_proposal(CFG, "lab", tmp_path, 8.0) == pytest.approx(
        privacy.epsilon_of(8.0 / math.sqrt(2), 1, CFG.privacy.delta), rel=1e-6)
    assert privacy.all_spent(privacy.read_ledger(tmp_path)) == ((8.0, 1), (8.0, 1))
    base = replace(CFG, pretrain=replace(CFG.pretrain, epochs=4), train=replace(CFG.train, epochs=4))
    alone, both = privacy.spent(base, "lab"), privacy.spent(base, "lab", earlier=((8.0, 1), (8.0, 1)))
    z_eff = (alone.releases / alone.multiplier**2 + 2 / 64) ** -0.5  # Gaussian mechanisms compose into one
    assert both.epsilon == pytest.approx(privacy.epsilon_of(z_eff, 1, CFG.privacy.delta), rel=1e-9)
    assert both.epsilon > alone.epsilon and both.to_dict()["earlier"] == [[8.0, 1], [8.0, 1]]
    tight = replace(base, privacy=replace(base.privacy, epsilon=alone.epsilon * 1.0001))
    assert privacy.check_budget(tight, "lab").epsilon <= tight.privacy.epsilon
    with pytest.raises(InputError, match="before the schedule: 2 at noise multiplier 8; its encoding.s, its clip "
                                         "proposals. and earlier models"):
        privacy.charge_training(tight, "lab", tmp_path)  # the proposals in its ledger leave no room: refused
    with pytest.raises(InputError, match="raise --multiplier"):
        privacy.charge_proposal(replace(CFG, privacy=replace(CFG.privacy, epsilon=0.1)), "lab", tmp_path / "x", 1.0)
    assert not (tmp_path / "x" / privacy.LEDGER).exists()  # refused before anything is recorded or released


def test_retraining_the_same_rows_spends_again_and_is_refused_past_the_budget(tmp_path):
    # Before, each training wrote a fresh ledger: a party could retrain as often as it liked within one budget.
    base = replace(CFG, pretrain=replace(CFG.pretrain, epochs=4), train=replace(CFG.train, epochs=4))
    once = privacy.spent(base, "lab")
    budget = replace(base, privacy=replace(base.privacy, epsilon=once.epsilon * 1.3))  # room for one training
    used, entry = privacy.charge_training(budget, "lab", tmp_path)
    assert used.epsilon == pytest.approx(once.epsilon) and entry["earlier"] == []
    privacy.write_json(tmp_path / privacy.LEDGER, entry)  # what `train` leaves in the party's model folder
    privacy.charge_prediction(budget, "lab", tmp_path)  # one prediction run since
    with pytest.raises(InputError, match="earlier models"):
        privacy.charge_training(budget, "lab", tmp_path)
    roomy = replace(base, privacy=replace(base.privacy, epsilon=once.epsilon * 3))
    again, entry = privacy.charge_training(roomy, "lab", tmp_path)
    before = (once.multiplier, once.releases + 2)  # the first model's training, validation pass and one run
    assert entry["earlier"] == [list(before)]
    assert again.epsilon == pytest.approx(privacy.epsilon_of(once.multiplier, once.releases, base.privacy.delta,
                                                             (before,)), rel=1e-9)


def test_propose_clips_prints_one_line_per_clip_and_charges_the_partys_own_ledger(tmp_path, capsys, monkeypatch):
    assert main(["demo", "--dataset", "wine", "--parties", "3", "--out", str(tmp_path)]) == 0
    config = tmp_path / "federation.toml"
    config.write_text(config.read_text() + "\n[privacy]\nepsilon = 8.0\nnoise_multiplier = 6.0\n")
    capsys.readouterr()
    active = [line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("active")][0]
    assert main(["propose-clips", "--config", str(config), "--party", active]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("clip_")]
    assert [line.split(" = ")[0] for line in lines] == [f"clip_{name}" for name in NAMES]
    assert all(float(line.split(" = ")[1]) > 0 for line in lines)
    assert len(privacy.read_ledger(tmp_path / active / "model")["clip_proposals"]) == 1
    assert main(["propose-clips", "--config", str(config), "--party", active, "--quantile", "1.5"]) == 2
    assert "error: propose-clips: --quantile 1.5 must be in (0, 1)" in capsys.readouterr().err
    # Noise that leaves no positive count (few rows, a large multiplier) proposes nothing, never "nan".
    monkeypatch.setattr(clip_proposal, "release", lambda norms, z, stream: {n: -np.ones(len(EDGES)) for n in NAMES})
    assert main(["propose-clips", "--config", str(config), "--party", active]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and out.count("no proposal (the noise left no positive count") == len(NAMES), out
