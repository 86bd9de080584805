"""Executable threat models: audits of the views recorded in real distributed runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_equivalence import make_job

from falsevfl_secure.audit import (
    AuditReport,
    audit_active_view,
    audit_passive_view,
    load_threat_model,
    share_bits_uniform,
)
from falsevfl_secure.runtime.session import WorldSession, build_job_world, run_job_step
from falsevfl_secure.transport import STAGE1_ROUNDS, LocalTransport

PARTIES, ACTIVE = 4, 3
# Encoding precision of a revealed sum: mpc rounds each of K addends to 2^-16; CKKS at 2^40 is ~1e-8.
TOLERANCE = {"plain": (1e-6, 1e-6), "mpc": (PARTIES * 2.0**-16, 1e-6), "he": (1e-6, 1e-6)}


def shadow_of(job: dict) -> list[dict]:
    shadow: list[dict] = []
    world, data = build_job_world(job, None, LocalTransport(PARTIES, ACTIVE, shadow=shadow))
    run_job_step(world, data, job)
    return shadow


def recorded(protocol: str, job: dict) -> dict[int, dict]:
    with WorldSession(protocol, PARTIES) as world:
        return world.run({**job, "record_views": True})


def stage1_job(variant: str = "I", seed: int = 3) -> dict:
    return make_job(PARTIES, variant, 24, 3, seed, 0.3, "pretrain")


def test_every_threat_model_file_is_complete():
    names = [p.stem for p in Path(__file__).resolve().parents[1].joinpath("threat_models").glob("*.toml")]
    assert {"active_semi_honest", "passive_semi_honest", "aggregator_he", "collusion", "labels",
            "eavesdropper_plain"} <= set(names)
    root = Path(__file__).resolve().parents[1]
    for name in names:
        model = load_threat_model(name)
        assert model["enforced_by"], name
        for reference in model["enforced_by"]:  # every named test exists, so the files cannot rot
            path, _, test = reference.split(" ")[0].partition("::")
            assert (root / path).is_file(), (name, reference)
            if test:
                assert f"def {test.split('[')[0]}(" in (root / path).read_text(), (name, reference)


@pytest.mark.parametrize("protocol", ["mpc", "he"])
@pytest.mark.parametrize("variant", ["I", "II"])
def test_active_party_learns_only_sums(protocol, variant):
    model = load_threat_model("active_semi_honest")
    assert protocol in model["protocols"]
    job = stage1_job(variant)
    reports = recorded(protocol, job)
    atol, rtol = TOLERANCE[protocol]
    report = audit_active_view(reports[ACTIVE]["view"], shadow_of(job), ACTIVE, atol, rtol)
    assert report.entries_checked >= 3  # posterior, likelihood, latent_grad
    assert report.passed, report.leaks


def test_the_audit_catches_the_plain_leak():
    job = stage1_job()
    reports = recorded("plain", job)
    report = audit_active_view(reports[ACTIVE]["view"], shadow_of(job), ACTIVE, *TOLERANCE["plain"])
    assert not report.passed
    assert {leak.split("'")[1] for leak in report.leaks} == {"posterior", "likelihood", "latent_grad"}


def test_mpc_shares_are_uniform():
    job = make_job(PARTIES, "I", 96, 4, 9, 0.3, "pretrain")
    reports = recorded("mpc", job)
    shares = [e["value"] for e in reports[ACTIVE]["view"] if e["protection"] == "secret-shared"]
    assert len(shares) == 3 * (PARTIES - 1)
    ok, worst = share_bits_uniform(shares)
    assert ok, worst
    # The check is not vacuous: encoded plaintext (the same amount of fixed-point values) fails it.
    n = sum(s.size for s in shares)
    plain_encoded = [np.round(np.random.default_rng(0).normal(size=n) * 2**16).astype(np.int64)]
    assert not share_bits_uniform(plain_encoded)[0]


@pytest.mark.parametrize("protocol", ["plain", "mpc", "he"])
def test_passive_party_receives_only_broadcasts(protocol):
    job = stage1_job()
    reports = recorded(protocol, job)
    shadow = shadow_of(job)
    combined = AuditReport()
    for party in range(PARTIES - 1):
        view = reports[party]["view"]
        assert [e["round"] for e in view] == ["latent", "likelihood_grad", "posterior_grad"]
        report = audit_passive_view(view, shadow, party)
        combined.leaks += report.leaks
    assert combined.passed, combined.leaks


@pytest.mark.parametrize("stage", ["pretrain", "train", "predict"])
def test_no_label_dependent_message_reaches_a_passive_party(stage):
    job = make_job(PARTIES, "II", 16, 3, 5, 0.3, stage)
    with WorldSession("plain", PARTIES) as world:
        original = world.run({**job, "record_views": True})
        permuted = world.run({**job, "record_views": True, "permute_labels": True})
    for party in range(PARTIES - 1):
        a, b = original[party]["view"], permuted[party]["view"]
        assert [e["round"] for e in a] == [e["round"] for e in b]
        assert all(np.array_equal(x["value"], y["value"]) for x, y in zip(a, b, strict=True)), party
        if stage != "pretrain":
            assert [e["round"] for e in a] == ["latent"]


def test_aggregator_cannot_decrypt():
    import torch

    from falsevfl_secure.secure.ckks import (
        decrypt_tensor,
        encrypt_tensor,
        load_public_context,
        make_secret_context,
        public_context_bytes,
    )

    secret = make_secret_context()
    aggregator_context = load_public_context(public_context_bytes(secret))
    assert not aggregator_context.has_secret_key()
    chunks = encrypt_tensor(aggregator_context, torch.ones(3, 2))
    with pytest.raises(ValueError):
        decrypt_tensor(aggregator_context, chunks, (3, 2))


def test_he_collusion_threshold_active_plus_aggregator_decrypts_individual_contributions():
    """collusion.toml, he: the aggregator's view (individual ciphertexts) plus the active party's
    secret key reveals each contribution; the active party alone only ever receives the sum."""
    import torch

    from falsevfl_secure.secure.ckks import (
        decrypt_tensor,
        encrypt_tensor,
        load_public_context,
        make_secret_context,
        public_context_bytes,
        sum_encrypted,
    )

    model = load_threat_model("collusion")
    assert "aggregator" in model["threshold_he"]
    secret = make_secret_context()
    public = load_public_context(public_context_bytes(secret))
    contributions = [torch.randn(4, 3, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    aggregator_view = [encrypt_tensor(public, c, n_addends=3) for c in contributions]
    # The coalition: the aggregator hands its view to the active party, which decrypts each one.
    for chunks, c in zip(aggregator_view, contributions, strict=True):
        assert torch.allclose(decrypt_tensor(secret, chunks, (4, 3)).float(), c, atol=1e-6)
    # The active party alone: what it receives is the aggregated sum, equal to no single contribution.
    alone = decrypt_tensor(secret, sum_encrypted(public, aggregator_view), (4, 3)).float()
    assert torch.allclose(alone, sum(contributions), atol=1e-6)
    assert not any(torch.allclose(alone, c, atol=1e-3) for c in contributions)


def test_a_recorded_training_run_is_audited_and_the_audit_is_not_vacuous(tmp_path):
    """`simulate --audit`: every role of a real distributed run records its view of one probe step;
    the secure protocols pass the audit, and plain fails it (it sends every contribution in clear)."""
    import json

    from falsevfl_secure.simulate import main

    common = ["--runtime", "distributed", "--parties", "4", "--pretrain-epochs", "1", "--train-epochs", "2",
              "--quiet"]
    audits = {}
    for protocol in ("plain", "mpc", "he"):
        out = tmp_path / protocol
        code = main(["--protocol", protocol, *common, "--audit", "--out", str(out)])
        assert code == 0, protocol
        result = json.loads((out / "result.json").read_text())
        audits[protocol] = result["audit"]
        assert sorted(p.name for p in (out / "views").glob("rank*.pkl")) == [
            f"rank{r}.pkl" for r in range(5 if protocol == "he" else 4)]
    for protocol in ("mpc", "he"):
        assert audits[protocol]["passed"], audits[protocol]["leaks"]
        assert audits[protocol]["entries_checked"] >= 3 + 3 * 3  # active: 3 sums; passive: 3 broadcasts each
    assert audits["he"]["views_audited"] == 5  # four parties and the aggregator
    assert audits["mpc"]["shares_uniform"]
    assert not audits["plain"]["passed"] and audits["plain"]["leaks_found"] >= 3


def test_the_probe_step_leaves_parameters_and_random_streams_as_they_were():
    """--audit's probe step must not change the training that follows (test_model checks the same
    training twice gives the same result; here the state before and after the probe is compared)."""
    import torch

    from falsevfl_secure.config import make_config
    from falsevfl_secure.runtime.local import make_splits
    from falsevfl_secure.train import host_split, probe_step
    from falsevfl_secure.world import make_world

    cfg = make_config("digits", "quick", variant="II")
    dataset, split, _ = make_splits(cfg, ())
    cpu = torch.device("cpu")
    world = make_world(cfg, {k: b.shape[1] for k, b in enumerate(split.blocks)}, dataset.n_classes,
                       LocalTransport(cfg.parties, cfg.active), cpu)
    data = host_split(split, range(cfg.parties), True, cpu, dataset.n_classes)
    modules = [*world.parties.values(), world.active]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]
    streams = {role: g.get_state().clone() for role, g in world.generators.items()}
    probe_step(world, data)
    assert world.transport.log.trace == list(STAGE1_ROUNDS)  # it did run the rounds of a stage-1 step
    for module, state in zip(modules, before, strict=True):
        assert all(torch.equal(v, state[k]) for k, v in module.state_dict().items())
        assert all(p.grad is None for p in module.parameters())
    assert all(torch.equal(g.get_state(), streams[role]) for role, g in world.generators.items())
