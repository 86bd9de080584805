"""The methods behind the `Method` seam: each baseline's defining behaviour (paper, App. D.1) checked against
an independent computation, the secret randomness each draws, resumed runs, the command line for every
method and protocol, and the federation's `[model] method`."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_equivalence import make_job
from torch.nn.utils import parameters_to_vector

from falsevfl_secure.audit import audit_active_view, contributions, share_bits_uniform
from falsevfl_secure.config import Config, Stage, StageConfig
from falsevfl_secure.data.synthetic import synthetic_split
from falsevfl_secure.errors import InputError
from falsevfl_secure.methods import SETTINGS, build_node, make_config, method_for, method_labels
from falsevfl_secure.model.ssl import augment
from falsevfl_secure.node import Batch
from falsevfl_secure.placement import Active
from falsevfl_secure.randomness import RoleSecret
from falsevfl_secure.runtime.local import run_local
from falsevfl_secure.runtime.session import build_step
from falsevfl_secure.train import host_split, optimizers_for, run_stage
from falsevfl_secure.transport import LocalTransport
from falsevfl_secure.transport.views import Entry, View

CPU = torch.device("cpu")


def small(method: str, parties: int = 4, seed: int = 3, **kw) -> Config:
    settings = {k: v for k, v in kw.items() if k in SETTINGS}  # the rest are the method's own options
    return Config(dataset="synthetic", parties=parties, method=method, h_dim=6, party_hidden=12,
                  discriminator_hidden=12, pretrain=StageConfig(0.02, 16, 1, 0.0, "sgd"),
                  train=StageConfig(1e-2, 8, 2), seed=seed, options={k: v for k, v in kw.items() if k not in settings},
                  **settings)


def node_and_data(cfg: Config, n: int = 60, p: float = 0.4, n_labeled: int | None = None, secret_seed: int = 5):
    """Every party in one process (secrets fixed per party: repeated builds are identical)."""
    split = synthetic_split(n=n, parties=cfg.parties, p_missing=p, seed=cfg.seed, n_labeled=n_labeled)
    widths = {k: b.shape[1] for k, b in enumerate(split.blocks)}
    secrets = {k: RoleSecret.for_tests(secret_seed, k) for k in widths}
    node = build_node(cfg, widths, 3, LocalTransport(cfg.parties, cfg.active_index), CPU, secrets)
    return node, host_split(split.view(range(cfg.parties), True), CPU, 3), split


def fine_tuned(cfg: Config, edit=None) -> list[torch.Tensor]:
    """Every parameter after stage 2 (from the same initial weights), the hosted data first `edit`ed."""
    node, data, split = node_and_data(cfg, n_labeled=40)
    if edit is not None:
        edit(data, split)
    run_stage(node, data, Stage.TRAIN, optimizers_for(node, Stage.TRAIN), progress=False)
    return [p.detach().clone() for m in node.modules() for p in m.parameters()]


# -------------------------------------------------------------------------------------------- Vanilla VFL


def test_vanilla_fine_tunes_only_on_the_labeled_rows_every_party_holds():
    cfg = small("vanilla")
    node, data, split = node_and_data(cfg, n_labeled=40)
    full = np.flatnonzero(~split.missing[:40].any(axis=1))
    partial = np.setdiff1d(np.arange(40), full)
    assert len(full) >= 3 and len(partial) >= 10
    for epoch in range(3):
        rows = np.concatenate(node.method.plan(Stage.TRAIN, data, epoch, cfg.seed, 8))
        assert sorted(rows.tolist()) == full.tolist()

    def relabel(rows):
        def edit(data, split):
            data.y = Active(data.y.get().clone().index_fill_(0, torch.as_tensor(rows), 2))
            for k in data.x:
                data.x[k][rows] = data.x[k][rows] + 3.0 * data.held[k][rows].unsqueeze(-1)
        return edit

    reference = fine_tuned(cfg)
    assert all(torch.equal(a, b) for a, b in zip(reference, fine_tuned(cfg, relabel(partial)), strict=True))
    changed = fine_tuned(cfg, relabel(full[:1]))  # the same edit of a row every party holds does count
    assert not all(torch.equal(a, b) for a, b in zip(reference, changed, strict=True))


def test_zero_imputation_of_the_features_gives_a_missing_party_s_embedding_of_zeros():
    for impute in ("embedding", "features"):
        cfg = small("vanilla", impute=impute)
        node, data, split = node_and_data(cfg, n=20, p=0.5)
        batch = data.batch(np.arange(20))
        missing = np.flatnonzero(split.missing[:, 0])
        with torch.no_grad():
            addend = node.method.contribution(node, batch, 0, training=False)[missing]
            expected = node.parties[0].model.embed(torch.zeros(len(missing), batch.x[0].shape[1]))
        assert len(missing) and torch.allclose(addend, expected if impute == "features" else torch.zeros_like(addend))


def test_vanilla_refuses_to_fine_tune_without_a_labeled_row_every_party_holds(refused):
    cfg = small("vanilla")
    node, data, split = node_and_data(cfg, n=30, p=0.9, n_labeled=10)
    assert split.missing[:10].any(axis=1).all()
    with pytest.raises(InputError, match="stage 2 of vanilla has nothing to train on: it trains on the labeled "
                                         "rows every party holds"):
        run_stage(node, data, Stage.TRAIN, optimizers_for(node, Stage.TRAIN), progress=False)
    refused("split")


# ------------------------------------------------------------------------------------------------ PlugVFL


def test_plugvfl_drops_each_passive_block_at_rate_one_half_never_the_active_and_not_at_test():
    cfg = small("plugvfl")
    node, data, _ = node_and_data(cfg, n=250, p=0.0)
    batch = data.batch(np.arange(data.n))
    dropped = {k: [] for k in node.parties}
    for _ in range(8):
        for k in node.parties:
            addend = node.method.contribution(node, batch, k, training=True)
            dropped[k].append((addend == 0).all(dim=-1))
            assert not (node.method.contribution(node, batch, k, training=False) == 0).all(dim=-1).any()
    rates = {k: float(torch.cat(v).double().mean()) for k, v in dropped.items()}
    active = cfg.active_index
    assert rates[active] == 0.0
    for k in set(node.parties) - {active}:
        assert abs(rates[k] - 0.5) < 4 * np.sqrt(0.25 / (8 * data.n)), rates  # 4 standard deviations
    passive = sorted(set(node.parties) - {active})
    assert not torch.equal(dropped[passive[0]][0], dropped[passive[1]][0])  # each party draws its own


def test_plugvfl_drops_come_from_the_party_s_secret_not_the_public_seed():
    cfg = small("plugvfl")
    draws = []
    for secret_seed in (5, 5, 6):
        node, data, _ = node_and_data(cfg, n=64, p=0.0, secret_seed=secret_seed)
        draws.append(node.method.contribution(node, data.batch(np.arange(64)), 0, training=True).eq(0).all(-1))
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


# ---------------------------------------------------------------------------------------------- LASER-VFL


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), p=st.sampled_from([0.3, 0.6]), parties=st.integers(2, 5))
def test_laser_predicts_each_row_with_its_observed_subset_s_predictor(seed, p, parties):
    cfg = small("laser", parties=parties, seed=seed)
    node, data, split = node_and_data(cfg, n=30, p=p)
    batch = data.batch(np.arange(data.n))
    predictions = node.method.predict(node, batch).get()
    head = node.active.get().model
    with torch.no_grad():
        for i in range(data.n):
            observed = np.flatnonzero(~split.missing[i])
            embeddings = [node.parties[k].model.embed(batch.x[k][i:i + 1]) for k in observed]
            expected = head.predict(torch.cat(embeddings).mean(dim=0, keepdim=True))[0]
            assert torch.allclose(predictions[i], expected, atol=1e-6)
            if len(observed) < parties:  # not the zero-imputed mean over all K (Vanilla's and PlugVFL's)
                assert not torch.allclose(head.predict(torch.cat(embeddings).sum(0, keepdim=True) / parties)[0],
                                          expected, atol=1e-6)


def test_laser_batches_share_one_observed_set_and_sample_one_subset_of_it_per_size():
    cfg = small("laser", parties=5)
    node, data, split = node_and_data(cfg, n=120, p=0.3, n_labeled=100)
    plan = node.method.plan(Stage.TRAIN, data, 0, cfg.seed, 8)
    assert sorted(np.concatenate(plan).tolist()) == list(range(100))  # every labeled row, once
    for index, rows in enumerate(plan):
        patterns = ~split.missing[rows]
        assert (patterns == patterns[0]).all()  # one observed set per batch
        subsets = node.method.batch(data, rows, Stage.TRAIN, 0, index, cfg.seed).subsets
        assert sorted(subsets.sum(axis=1).tolist()) == list(range(1, int(patterns[0].sum()) + 1))
        assert not (subsets & ~patterns[0]).any()  # subsets of the observed set only


@settings(max_examples=15, deadline=None)
@given(observed=st.lists(st.booleans(), min_size=2, max_size=6).filter(any), seed=st.integers(0, 2**31))
def test_laser_s_weighted_subset_draws_estimate_the_sum_over_every_subset(observed, seed):
    # The objective of LASER-VFL's heads is the sum of the losses of every non-empty subset of the observed
    # set; one draw per size, weighted C(|O|, m), must estimate it without bias (closed form: exhaustive sum).
    from itertools import combinations
    from math import comb

    from falsevfl_secure.methods.laser import draw_subsets
    from falsevfl_secure.randomness import PublicStream, public_rng

    mask = np.asarray(observed)
    members = np.flatnonzero(mask).tolist()
    loss = {c: float(v) for c, v in zip((c for m in range(1, len(members) + 1) for c in combinations(members, m)),
                                        np.random.default_rng(seed).uniform(0, 1, 2 ** len(members)), strict=False)}
    exact = sum(loss.values())
    draws = 4000
    estimates = np.empty(draws)
    for i in range(draws):
        subsets = draw_subsets(mask, public_rng(seed, PublicStream.SUBSETS, 0, i))
        estimates[i] = sum(comb(len(members), int(row.sum())) * loss[tuple(np.flatnonzero(row))] for row in subsets)
    assert abs(estimates.mean() - exact) < 5 * estimates.std() / draws**0.5 + 1e-9


# ------------------------------------------------------------------------------------------------ FedHSSL


def shared_before(job) -> np.ndarray:
    """Each party's FedHSSL shared parameters before the step (independently of the transports)."""
    node, _ = build_step(job, list(range(job.config.parties)), True, LocalTransport(job.config.parties,
                                                                                    job.config.active_index))
    return np.stack([parameters_to_vector(r.model.shared()).detach().numpy() for r in node.parties.values()])


def model_sum_view(report: dict) -> View:
    return View(Entry(**{**e, "value": np.asarray(e["value"])}) for e in report["view"] if e["round"] == "model_sum")


@pytest.mark.parametrize("protocol", ["mpc", "plain"])
def test_fedhssl_model_average_is_a_secure_sum_equal_to_the_plain_average(sessions, protocol):
    parties = 4
    job = make_job(parties, "I", 12, 1, 17, 0.3, "pretrain", method="fedhssl", epoch_end=True, record=True)
    job = replace(job, config=replace(job.config, h_dim=32))  # enough shared parameters to test the shares
    reports = sessions(protocol, parties).run(job)
    before, active = shared_before(job), parties - 1
    mean = before.mean(axis=0)
    for k, report in reports.items():  # every party ends with the average of everyone's shared parameters
        node, _ = build_step(job, [k], k == active, LocalTransport(parties, active))
        names = [n for n, p in node.parties[k].model.named_parameters()
                 if any(p is q for q in node.parties[k].model.shared())]
        after = np.concatenate([report["parameters"][f"party{k}.{n}"].ravel() for n in names])
        np.testing.assert_allclose(after, mean, atol=parties * 2.0**-16)
    views = {k: model_sum_view(r) for k, r in reports.items()}
    received = views[active].of("received")
    leaks = audit_active_view(views[active], contributions(views), active, atol=parties * 2.0**-16).leaks
    if protocol == "plain":  # the same audit catches the plain protocol: each party's parameters in clear
        assert leaks
        return
    assert received and all(e.protection == "secret-shared" and e.value.dtype == np.int64 for e in received)
    assert not leaks and share_bits_uniform([e.value for e in received])[0]
    assert [e.kind for e in views[0]] == ["sent"]  # a passive party receives nothing of the sum


# ------------------------------------------------------------------------------ augmentation and resuming


def test_the_tabular_augmentation_replaces_30_percent_of_each_row_from_the_party_s_secret():
    x = torch.zeros(50, 20)
    low, high = torch.full((20,), 1.0), torch.full((20,), 2.0)
    draws = [augment(x, low, high, RoleSecret.for_tests(s, 0).stream("party/ssl/augment")) for s in (1, 1, 2)]
    replaced = draws[0] != 0
    assert (replaced.sum(dim=1) == 6).all()  # round(0.3 * 20) features of every row
    assert ((draws[0][replaced] >= 1.0) & (draws[0][replaced] <= 2.0)).all()
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


def test_a_baseline_resumed_from_its_checkpoints_ends_as_an_uninterrupted_run(tmp_path):
    """FedHSSL: SGD momentum, batch norm statistics, the augmentation streams and the model average."""
    cfg = replace(make_config("digits", "quick", method="fedhssl", max_rows=40, parties=4),
                  pretrain=StageConfig(0.025, 32, 2, 3e-5, "sgd"), train=StageConfig(1e-3, 16, 2))
    secrets = {k: RoleSecret.for_tests(9, k) for k in range(4)}
    patterns = ("mcar:0",)
    run_local(cfg, patterns, progress=False, checkpoint_dir=tmp_path / "a", secrets=secrets)

    def stop(stage, epoch, optimizers):
        if (stage, epoch) == (Stage.PRETRAIN, 0):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, patterns, progress=False, checkpoint_dir=tmp_path / "b", secrets=secrets, after_epoch=stop)
    run_local(cfg, patterns, progress=False, checkpoint_dir=tmp_path / "b", resume=True)
    for k in range(4):
        a, b = (torch.load(tmp_path / d / f"party{k}-stage2-epoch00001.pt", weights_only=True) for d in "ab")
        assert set(a) == set(b)
        for name, tensor in a["party_module"].items():
            assert torch.equal(tensor, b["party_module"][name]), (k, name)


# ------------------------------------------------------------------------------------------ command line


def test_simulate_runs_every_method_under_every_protocol(tmp_path):
    from falsevfl_secure.simulate import main
    from falsevfl_secure.transport import PROTOCOLS

    for protocol in PROTOCOLS:
        for label in method_labels():
            out = tmp_path / f"{label}-{protocol}"
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                code = main(["--method", label, "--protocol", protocol, "--preset", "quick", "--pretrain-epochs", "1",
                             "--train-epochs", "1", "--max-rows", "20", "--out", str(out), "--quiet", "--threads", "1"])
            result = json.loads((out / "result.json").read_text())
            assert code == 0 and result["protocol"] == protocol and len(result["accuracy"]) == 7, (label, protocol)
            assert result["config"]["method"] == method_labels()[label][0]
            rounds = {row["round"] for row in result["communication"]}
            table = {r.name for r in build_node_for(label).method.rounds.rounds}
            assert rounds <= table and rounds, (label, protocol, rounds)


def build_node_for(label: str):
    method, options = method_labels()[label]
    cfg = small(method, **options)
    return build_node(cfg, {k: 5 for k in range(cfg.parties)}, 3, LocalTransport(cfg.parties, cfg.active_index), CPU)


def test_the_variant_option_is_an_alias_of_the_method(refused):
    from falsevfl_secure.simulate import configure, parse_args

    cfg, _ = configure(parse_args(["--variant", "II"]))
    assert (cfg.method, cfg.options["variant"], method_for(cfg).label) == ("false-vfl", "II", "false-vfl-ii")
    cfg, _ = configure(parse_args(["--method", "laser"]))
    assert (cfg.method, method_for(cfg).label, cfg.pretrain.optimizer) == ("laser", "laser", "sgd")
    with pytest.raises(InputError, match="disagree"):
        configure(parse_args(["--method", "false-vfl-i", "--variant", "II"]))
    refused("cli option")
    with pytest.raises(InputError, match="variant='II' is false-vfl's option, not vanilla's"):
        configure(parse_args(["--method", "vanilla", "--variant", "II"]))
    refused("cli option")


# ------------------------------------------------------------------------------------------- federation


def federation_file(tmp_path: Path, model: str) -> Path:
    from falsevfl_secure.federation.tables_demo import Spec, write_federation

    return write_federation(tmp_path, Spec(model=model)).path


@pytest.mark.parametrize(("model", "method", "variant"), [
    ('method = "plugvfl"\n', "plugvfl", "I"), ('method = "false-vfl-ii"\n', "false-vfl", "II"),
    ('variant = "II"\n', "false-vfl", "II"), ("", "false-vfl", "I"),
    ('method = "false-vfl-ii"\nvariant = "II"\n', "false-vfl", "II"),  # agreeing: allowed, as documented (was
    ('method = "false-vfl-i"\nvariant = "I"\n', "false-vfl", "I")])    # refused: variant passed twice)
def test_federation_model_method(tmp_path, model, method, variant):
    from falsevfl_secure.federation.config import load_federation

    cfg = load_federation(federation_file(tmp_path, model)).model
    assert (cfg.method, cfg.options.get("variant", "I")) == (method, variant)
    if method == "plugvfl":
        assert cfg.pretrain.optimizer == "sgd"  # the baseline's own schedule


@pytest.mark.parametrize(("model", "message"), [
    ('method = "vanilla"\n', "runs in `simulate` only"), ('method = "laser"\n', "runs in `simulate` only"),
    ('method = "false-vfl-ii"\nvariant = "I"\n', "disagree"), ('method = "svm"\n', "choose one of")])
def test_federation_refuses_a_method_it_cannot_run(tmp_path, model, message, refused):
    from falsevfl_secure.federation.config import load_federation

    with pytest.raises(InputError, match=message):
        load_federation(federation_file(tmp_path, model))
    refused("federation method")


def test_parties_that_name_different_methods_do_not_agree(tmp_path):
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.launch import agreement_settings

    a = load_federation(federation_file(tmp_path / "a", 'method = "plugvfl"\n'))
    b = load_federation(federation_file(tmp_path / "b", 'method = "false-vfl-i"\n'))
    settings_a, settings_b = agreement_settings(a, "train"), agreement_settings(b, "train")
    assert settings_a["method"] == "plugvfl" and settings_b["method"] == "false-vfl-i"
    differ = {k for k in set(settings_a) | set(settings_b) if settings_a.get(k) != settings_b.get(k)}
    # the method, the fingerprint, and each setting as the file writes it (a method brings its own schedule and options)
    assert {"method", "model", "[model] method", "[model] plug_drop", "[model.pretrain] optimizer"} <= differ
    assert all(k.startswith("[model") for k in differ - {"method", "model"}), differ


def test_a_method_registers_its_names_options_and_schedules_in_one_class(monkeypatch, refused):
    """A new method is one class that declares itself: `make_config`, the command line and the checks take its
    names, options and schedules from the registry; another method's option or a value outside the choices is
    refused by name, and the option reaches the method's code."""
    from falsevfl_secure.methods import METHODS, Option, Vanilla, method_labels, parse_method
    from falsevfl_secure.simulate import configure, parse_args

    class Halved(Vanilla):
        name = "halved"
        options = {**Vanilla.options, "halve": Option(("no", "yes"), "halve the fused embedding")}

        def fuse(self, node, batch, training):
            return super().fuse(node, batch, training).map(lambda m: m / 2 if self.settings["halve"] == "yes" else m)

    monkeypatch.setitem(METHODS, "halved", Halved)
    assert parse_method("halved") == ("halved", {}) and "halved" in method_labels()
    cfg = make_config("digits", "quick", method="halved", halve="yes")
    assert cfg.options == {"impute": "embedding", "halve": "yes"} and cfg.train == make_config(
        "digits", "quick", method="vanilla").train  # its schedules are Vanilla's, inherited
    cfg, _ = configure(parse_args(["--method", "halved", "--halve", "yes", "--max-rows", "40"]))
    assert method_for(cfg).settings["halve"] == "yes"
    for bad, message in ((dict(halve="maybe"), "halve='maybe': choose 'no' or 'yes'"),
                         (dict(plug_drop="batch"), "plug_drop='batch' is plugvfl's option, not halved's")):
        with pytest.raises(InputError, match=message):
            make_config("digits", "quick", method="halved", **bad)
        refused("config")
    with pytest.raises(InputError, match="halve='yes' is halved's option, not false-vfl's"):
        make_config("digits", "quick", halve="yes")
    refused("config")
    with pytest.raises(InputError, match="impute='features' is vanilla's or plugvfl's .*option, not false-vfl's"):
        make_config("digits", "quick", impute="features")  # every method that declares it is named
    refused("config")
    small_cfg = small("halved", halve="yes")
    node = build_node(small_cfg, {k: 5 for k in range(4)}, 3, LocalTransport(4, small_cfg.active_index), CPU)
    batch = Batch(x={k: torch.randn(6, 5) for k in node.parties}, held={k: torch.ones(6, dtype=torch.bool)
                  for k in node.parties}, n_observed=Active(torch.full((6,), 4)), y=Active.absent())
    halved = node.method.fuse(node, batch, training=False).get()
    node.method.settings["halve"] = "no"
    assert torch.allclose(halved * 2, node.method.fuse(node, batch, training=False).get())


@pytest.mark.parametrize("seed", [0, 1])
def test_the_discriminator_reads_the_posterior_mean_the_active_party_computed_from_the_sum(seed):
    """`discriminator_inputs = "latent+mean+own"`: the active party's own block, then the mean of q(h | x_obs),
    the closed form of the posterior sum it holds (Eq. (1)); the discriminator is that much wider."""
    from falsevfl_secure.bounds import latent_posterior
    from falsevfl_secure.methods.false_vfl_steps import encoded_count, forward_rounds, own_inputs
    from falsevfl_secure.model.active import own_width

    cfg = small("false-vfl", seed=seed, discriminator_inputs="latent+mean+own")
    node, data = node_and_data(cfg, n=30, p=0.4)[:2]
    batch = data.batch(np.arange(data.n))
    with torch.no_grad():
        own = own_inputs(node, batch, forward_rounds(node, batch, 4, Stage.PREDICT))
        total = sum(node.posterior_contributions(batch).values())
        mean = latent_posterior(*total.split(cfg.h_dim, dim=-1), encoded_count(node, batch).get()).loc
    block = own_width(data.x[cfg.active_index].shape[1])
    assert own.shape == (data.n, block + cfg.h_dim)
    assert torch.allclose(own[:, block:], mean, atol=1e-6)
    assert node.active.get().model.discriminator[0].in_features == cfg.h_dim + block + cfg.h_dim
