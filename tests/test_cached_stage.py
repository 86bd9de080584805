"""`stage2_pass = "once"` (cached_stage.py): stage 2's rounds run once, and every epoch trains the
discriminator from what they left. Checked against independent truth: the rows each summed round carries
(counted at the transport), the values a fresh pass of the rounds gives, the paper's conditional bound written
out here with logsumexp, and the privacy accounting's release count."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from falsevfl_secure import cached_stage, privacy
from falsevfl_secure.cached_stage import Stage2Cache, cached_epoch
from falsevfl_secure.config import PrivacyConfig, Stage
from falsevfl_secure.errors import InputError
from falsevfl_secure.methods import build_node, make_config
from falsevfl_secure.methods.false_vfl_steps import forward_rounds, own_inputs
from falsevfl_secure.randomness import RoleSecret
from falsevfl_secure.runtime.simulated import simulated_role
from falsevfl_secure.train import fit, host_split, optimizers_for
from falsevfl_secure.transport import LocalTransport
from falsevfl_secure.transport.rounds import POSTERIOR


def small(stage2_pass: str = "once"):
    cfg = make_config("digits", "quick", max_rows=400, seed=5, discriminator_inputs="latent+own",
                      stage2_pass=stage2_pass)
    return replace(cfg, pretrain=replace(cfg.pretrain, epochs=1), train=replace(cfg.train, epochs=3))


def hosted(cfg, secrets=None):
    role = simulated_role(cfg, ("mcar:0",), range(cfg.parties), with_labels=True)
    transport = LocalTransport(cfg.parties, cfg.active_index)
    node = build_node(cfg, role.widths, role.n_classes, transport, torch.device("cpu"), secrets)
    return node, host_split(role.train, torch.device("cpu"), role.n_classes)


def secrets(cfg):
    return {k: RoleSecret(bytes([k + 1]) * 32) for k in range(cfg.parties)}


@pytest.mark.parametrize("pass_", ["once", "every_epoch"])
def test_stage_two_carries_each_labeled_row_once_in_all_not_once_per_epoch(monkeypatch, pass_):
    cfg = small(pass_)
    node, data = hosted(cfg)
    carried, marks = [], {}
    original = LocalTransport.aggregate

    def counting(self, round, contributions):
        if round is POSTERIOR:
            carried.append(next(iter(contributions.values())).shape[0])
        return original(self, round, contributions)

    monkeypatch.setattr(LocalTransport, "aggregate", counting)
    fit(node, data, progress=False, after_epoch=lambda stage, epoch, _: marks.setdefault((stage, epoch), len(carried)))
    stage2 = sum(carried[marks[(Stage.PRETRAIN, 0)]:])
    labeled = len(data.labeled_index)
    assert stage2 == (labeled if pass_ == "once" else labeled * cfg.train.epochs)
    if pass_ == "once":  # nothing crosses after the first stage-2 epoch's pass
        assert marks[(Stage.TRAIN, 2)] == marks[(Stage.TRAIN, 0)]


def test_the_active_party_shows_its_progress_after_every_cached_epoch(monkeypatch):
    # The other parties wait for its next pass meanwhile, bounded from its last progress (RECV_TIMEOUT_S).
    cfg = small("once")
    node, data = hosted(cfg)
    calls, marks = [], []
    monkeypatch.setattr(LocalTransport, "working", lambda self: calls.append(len(marks)))
    fit(node, data, progress=False, after_epoch=lambda stage, epoch, _: marks.append((stage, epoch)))
    assert calls == [cfg.pretrain.epochs + e for e in range(cfg.train.epochs)], (calls, marks)


def test_the_cache_holds_what_the_rounds_gave_and_epochs_follow_the_papers_bound():
    cfg = small()
    node, data = hosted(cfg, secrets(cfg))
    for module in node.modules():
        module.train()
    cache = Stage2Cache(node, data)
    # A fresh node with the same secrets draws the same samples in the same order: the cache is that pass.
    again, data2 = hosted(cfg, secrets(cfg))
    rows = np.asarray(data.labeled_index)
    first = data2.batch(rows[:cfg.eval_batch_size])
    with torch.no_grad():
        weighted = forward_rounds(again, first, cfg.kappa, Stage.TRAIN).get()
    at = torch.from_numpy(cache.position[rows[:cfg.eval_batch_size]])
    torch.testing.assert_close(cache.h[:, at], weighted.h)
    torch.testing.assert_close(cache.log_w[:, at], weighted.log_w)
    torch.testing.assert_close(cache.own[at], own_inputs(again, first, again.active.map(lambda _: weighted)))

    # Two epochs from the cache against Adam on -mean(log (1/S) sum_s w_s p(y | h_s)), written out here.
    role = node.active.get()
    reference = copy.deepcopy(role.model)
    optimizer = torch.optim.Adam(reference.discriminator.parameters(), lr=cfg.train.lr,
                                 weight_decay=cfg.train.weight_decay)
    opts = optimizers_for(node, Stage.TRAIN)
    for epoch in range(2):
        losses = cached_epoch(node, data, cache, epoch, opts)
        plan = node.method.plan(Stage.TRAIN, data, epoch, cfg.seed, cfg.train.batch_size)
        for (loss, size), batch_rows in zip(losses, plan, strict=True):
            at = torch.from_numpy(cache.position[batch_rows])
            optimizer.zero_grad()
            log_p = reference.label_log_prob(cache.h[:, at], cache.y[at], cache.own[at])
            bound = torch.logsumexp(cache.log_w[:, at] + log_p, 0) - math.log(cache.h.shape[0])
            expected = -bound.mean()
            expected.backward()
            optimizer.step()
            assert size == len(batch_rows)
            torch.testing.assert_close(loss.get(), expected.detach(), rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(role.model.discriminator.parameters(), reference.discriminator.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_the_budget_counts_stage_two_once_and_refuses_the_same_epochs_run_every_epoch():
    cfg = replace(small(), pretrain=replace(small().pretrain, epochs=4), train=replace(small().train, epochs=50))
    every = replace(small("every_epoch"), pretrain=cfg.pretrain, train=cfg.train)
    stage1 = privacy.RELEASES["pretrain"] - (cfg.kappa == 1)
    assert privacy.releases_per_row(cfg) == stage1 * 4 + 2 + 2
    assert privacy.releases_per_row(every) == stage1 * 4 + 2 * 50 + 2
    budget = PrivacyConfig(epsilon=3.0, noise_multiplier=privacy.calibrate(3.0, stage1 * 4 + 4, 1e-5))
    assert privacy.check_budget(replace(cfg, privacy=budget), "party 1").epsilon <= 3.0
    with pytest.raises(InputError, match=r"party 1: the schedule would spend epsilon = \d"):
        privacy.check_budget(replace(every, privacy=budget), "party 1")


def test_a_local_simulation_feeds_the_active_partys_own_trees_and_the_distributed_one_refuses(tmp_path, monkeypatch):
    from sklearn.ensemble import HistGradientBoostingClassifier

    from falsevfl_secure.runtime.distributed import run_distributed
    from falsevfl_secure.runtime.local import run_local
    from falsevfl_secure.runtime.simulated import own_reference

    cfg = replace(small(), max_rows=200, options={**small().options, "own_reference": True})
    role = simulated_role(cfg, ("mcar:0", "mcar:0.5"), range(cfg.parties), with_labels=True)
    train, tests = own_reference(cfg, role)
    labeled, (x, held) = role.train.labeled_index, role.train.blocks[cfg.active_index]
    assert train.shape == (role.train.n, role.n_classes) and set(tests) == {"mcar:0", "mcar:0.5"}
    # A test row's score: the trees fitted on every labeled training row, on the block where it is held.
    trees = HistGradientBoostingClassifier(random_state=cfg.seed).fit(
        np.where(held[labeled, None], x[labeled], np.nan), role.train.labels.y[labeled])
    test_x, test_held = role.tests["mcar:0.5"].blocks[cfg.active_index]
    expected = np.log(np.clip(trees.predict_proba(np.where(test_held[:, None], test_x, np.nan)), 1e-6, 1))
    np.testing.assert_allclose(tests["mcar:0.5"], expected, rtol=1e-5, atol=1e-5)
    # A training row's own label never reaches its own score (out of fold).
    assert not np.allclose(train[labeled], np.log(np.clip(trees.predict_proba(
        np.where(held[labeled, None], x[labeled], np.nan)), 1e-6, 1)), atol=1e-3)
    # The discriminator reads them: its own inputs end with each row's score.
    seen = []
    monkeypatch.setattr(cached_stage, "own_inputs", lambda *a: seen.append(own_inputs(*a)) or seen[-1])
    nodes: list = []
    run_local(cfg, ("mcar:0",), progress=False, keep=nodes)
    assert nodes[0].active.get().model.own_inputs == 2 * x.shape[1] + 1 + role.n_classes
    cached_rows = np.concatenate([labeled[i:i + cfg.eval_batch_size] for i in range(0, len(labeled),
                                                                                    cfg.eval_batch_size)])
    np.testing.assert_allclose(torch.cat(seen)[:, -role.n_classes:].numpy(), train[cached_rows], rtol=1e-6)
    with pytest.raises(InputError, match="own_reference = true: the distributed simulation"):
        run_distributed(cfg, "plain", ("mcar:0",), progress=False, out_dir=tmp_path)


def test_a_party_cannot_rejoin_a_stage_two_that_ran_its_rounds_once():
    from falsevfl_secure.train import _rejoin

    node, _ = hosted(small())
    with pytest.raises(InputError, match="stage 2 runs its rounds once"):
        _rejoin(node, [], {}, Stage.TRAIN, 1)


def test_a_distributed_mpc_run_with_one_pass_of_stage_two_under_a_budget(tmp_path):
    """Every party in its own process, masks on the sums, noise under a budget: stage 2's one pass and the
    epochs after it (only the active party trains) end with every pattern scored and each party's epsilon."""
    import contextlib
    import io
    import json

    from falsevfl_secure import simulate

    out = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        code = simulate.main(["--protocol", "mpc", "--max-rows", "300", "--pretrain-epochs", "1", "--train-epochs",
                              "4", "--stage2-pass", "once", "--epsilon", "3", "--quiet", "--out", str(out)])
    result = json.loads((out / "result.json").read_text())
    assert code == 0 and result["config"]["options"]["stage2_pass"] == "once" and len(result["accuracy"]) == 7
    assert all(p["epsilon"] <= 3.0 for p in result["privacy"])
    assert result["losses"]["train"] and all(math.isfinite(v) for v in result["losses"]["train"])
