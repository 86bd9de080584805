"""Executable threat models: audits of the views recorded in real distributed runs, and the audit itself
shown not to be vacuous (it fails on plain, on unmasked shares, and when there are too few shares to test)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_equivalence import make_job

from falsevfl_secure.audit import (
    MIN_SHARE_VALUES,
    AuditReport,
    audit_active_view,
    audit_passive_view,
    audit_recorded_views,
    contributions,
    load_threat_model,
    share_bits_uniform,
)
from falsevfl_secure.config import Stage
from falsevfl_secure.methods import METHODS
from falsevfl_secure.runtime.session import local_reference
from falsevfl_secure.secure.fixed_point import encode_fixed_point
from falsevfl_secure.transport import PROTOCOLS
from falsevfl_secure.transport.views import Entry, View

SECURE = [name for name, p in PROTOCOLS.items() if p.hides_contributions]

PARTIES, ACTIVE = 4, 3
ATOL = PARTIES * 2.0**-16  # a revealed sum is the exact sum of K encodings, each within 2^-17


def as_view(entries: list[dict]) -> View:
    return View(Entry(e["round"], e["kind"], e["peer"], e["protection"], np.asarray(e["value"])) for e in entries)


def shadow_of(job) -> dict:
    """Every party's own contribution to every sum, from the plaintext reference of the same step."""
    record = View()
    local_reference(job, record)
    return contributions({0: record})


def recorded(sessions, protocol: str, job) -> dict[int, View]:
    reports = sessions(protocol, PARTIES).run(job)
    return {rank: as_view(report["view"]) for rank, report in reports.items()}


def stage1_job(variant: str = "I", seed: int = 3, batch: int = 24, kappa: int = 3):
    return make_job(PARTIES, variant, batch, kappa, seed, 0.3, "pretrain", record=True)


def test_every_threat_model_file_is_complete():
    root = Path(__file__).resolve().parents[1]
    files = sorted(root.joinpath("threat_models").rglob("*.toml"))
    names = [p.stem for p in files]
    assert all(p.parent.name == "threat_models" for p in files), "load_threat_model reads the folder's top level"
    assert {"active_semi_honest", "passive_semi_honest", "aggregator_he", "collusion", "labels", "dp",
            "eavesdropper", "alignment", "active_network_attacker", "malicious_pinned_party"} <= set(names)
    readme = root.joinpath("threat_models", "README.md").read_text()
    assert all(f"`{name}.toml`" in readme for name in names), "every file has its row in threat_models/README.md"
    parametrized = set()
    for name in names:
        model = load_threat_model(name)
        assert model["enforced_by"] and model["threshold" if "threshold" in model else "threshold_mpc"], name
        attacks = [item["attack"] for item in model["must_not_learn"] if isinstance(item, dict)]
        assert len(attacks) == len(model["must_not_learn"]), f"{name}: every 'must not learn' names its attack"
        for reference in [*model["enforced_by"], *attacks]:  # every named test exists, so the files cannot rot
            path, _, test = reference.split(" ")[0].partition("::")
            assert (root / path).is_file(), (name, reference)
            if test:
                assert f"def {test.split('[')[0]}(" in (root / path).read_text(), (name, reference)
            if "[" in test:
                parametrized.add(reference.split(" ")[0])
    # a parameter id names a collected test (pytest's own ids: "[I-mpc]", not "[mpc]")
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=",
                                "-p", "no:cacheprovider", *sorted(parametrized)], cwd=root, capture_output=True,
                               text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]


@pytest.mark.parametrize("protocol", SECURE)
@pytest.mark.parametrize("variant", ["I", "II"])
def test_active_party_learns_only_sums(sessions, protocol, variant):
    assert protocol in load_threat_model("active_semi_honest")["protocols"]
    job = stage1_job(variant)
    views = recorded(sessions, protocol, job)
    truth = contributions(views)  # the parties' own records of what they sent
    assert set(truth) == {"posterior", "likelihood", "latent_grad"}
    for name, parts in shadow_of(job).items():  # ... which are what the plaintext reference computes
        for k, value in parts.items():
            np.testing.assert_allclose(truth[name][k], value, rtol=1e-4, atol=1e-5)
    report = audit_active_view(views[ACTIVE], truth, ACTIVE, ATOL)
    assert report.entries_checked >= 3 * PARTIES if protocol == "mpc" else report.entries_checked >= 3
    assert report.passed, report.leaks


def test_the_audit_catches_the_plain_leak(sessions):
    views = recorded(sessions, "plain", stage1_job())
    report = audit_active_view(views[ACTIVE], contributions(views), ACTIVE, ATOL)
    assert not report.passed
    assert {leak.split("'")[1] for leak in report.leaks} == {"posterior", "likelihood", "latent_grad"}


def test_the_audit_decodes_shares_per_row_and_catches_unmasked_ones(sessions):
    """Shares are checked like any view: an mpc view whose shares were not masked fails the audit."""
    views = recorded(sessions, "mpc", stage1_job())
    truth = contributions(views)
    assert audit_active_view(views[ACTIVE], truth, ACTIVE, ATOL).passed
    def unmask(e: Entry) -> Entry:  # what the share would be without the pairwise masks
        encoded = encode_fixed_point(torch.as_tensor(truth[e.round][e.peer])).reshape(-1).numpy()
        return Entry(e.round, e.kind, e.peer, e.protection, np.append(encoded, 0))

    unmasked = View(unmask(e) if e.kind == "received" else e for e in views[ACTIVE])
    report = audit_active_view(unmasked, truth, ACTIVE, ATOL)
    assert not report.passed and all("received from" in leak for leak in report.leaks)


def test_the_audit_catches_an_he_aggregator_that_forwards_one_partys_ciphertext(sessions):
    """he: a ciphertext the active party receives is audited as what it decrypts to, its revealed sum (the round
    table lets it receive one message a round, the aggregator's). An aggregator that forwarded party 0's
    ciphertext instead of the sum would make it reveal that contribution: the audit names every round."""
    views = recorded(sessions, "he", stage1_job())
    truth = contributions(views)
    assert audit_active_view(views[ACTIVE], truth, ACTIVE, ATOL).passed

    def forwarded(e: Entry) -> Entry:  # what the active party decrypts from party 0's ciphertext
        return Entry(e.round, e.kind, e.peer, e.protection, truth[e.round][0]) if e.kind == "revealed" else e

    report = audit_active_view(View(forwarded(e) for e in views[ACTIVE]), truth, ACTIVE, ATOL)
    named = {leak.split("'")[1] for leak in report.leaks if "party 0's contribution" in leak}
    assert named == {"posterior", "likelihood", "latent_grad"}, report.leaks


def test_mpc_shares_are_uniform_and_too_few_to_test_is_a_failure(sessions):
    views = recorded(sessions, "mpc", make_job(PARTIES, "I", 96, 4, 9, 0.3, "pretrain", record=True))
    shares = [e.value for e in views[ACTIVE].of("received")]
    assert len(shares) == 3 * (PARTIES - 1) and sum(s.size for s in shares) >= MIN_SHARE_VALUES
    ok, worst = share_bits_uniform(shares)
    assert ok, worst
    # Not vacuous: what a build without masks would send (each party's own contributions of this step, encoded
    # on the fixed-point grid as the shares are) fails it ...
    truth = contributions(views)
    unmasked = [encode_fixed_point(torch.as_tensor(c)).reshape(-1).numpy() for parts in truth.values()
                for k, c in parts.items() if k != ACTIVE]
    assert sum(u.size for u in unmasked) >= MIN_SHARE_VALUES and not share_bits_uniform(unmasked)[0]
    # ... and too few values to test is a failure, not a skip.
    assert share_bits_uniform([shares[0][:MIN_SHARE_VALUES - 1]]) == (False, float("inf"))


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_passive_party_receives_only_broadcasts(sessions, protocol):
    views = recorded(sessions, protocol, stage1_job())
    truth = contributions(views)
    combined = AuditReport()
    for party in range(PARTIES - 1):
        assert [e.round for e in views[party].of("received")] == ["latent", "likelihood_grad", "posterior_grad"]
        combined.leaks += audit_passive_view(views[party], truth, party, atol=ATOL).leaks
    assert combined.passed, combined.leaks


@pytest.mark.parametrize("stage", ["predict", "train"])
@pytest.mark.parametrize("protocol", SECURE)
def test_a_forward_pass_without_a_party_gives_away_its_posterior_contribution(sessions, protocol, stage, attacked):
    """active_semi_honest.toml, disclosed: the same records predicted with party 1 and then without it (it holds
    no row, as when `predict --absent` leaves it out), or the same stage-2 batch before and after party 1 was
    lost (the generative part is frozen in stage 2, so a later epoch's sums differ from an earlier one's only by
    the parties in them). The active party subtracts the second revealed posterior sum from the first: party 1's
    posterior contribution, on every record it holds, to the fixed-point grid."""
    from dataclasses import replace

    job = make_job(PARTIES, "I", 24, 3, 3, 0.3, stage, record=True)  # seed 3: no record is party 1's alone
    without = replace(job, split={**job.split, "absent": (1,)})
    views = [recorded(sessions, protocol, j) for j in (job, without)]
    revealed = [[e.value for e in v[ACTIVE].of("revealed") if e.round == "posterior"][-1] for v in views]
    theirs = [e.value for e in views[0][1].of("sent") if e.round == "posterior"][-1]
    held = np.abs(theirs).max(axis=1) > 0
    error = np.abs((revealed[0] - revealed[1])[held] - theirs[held]).max(axis=1)
    recovered = int((error <= ATOL).sum())
    attacked(f"a {stage} step without a party (active)", protocol,
             f"party 1's posterior contribution on {recovered} of {int(held.sum())} records, to {error.max():.1g}")
    assert held.sum() >= 10 and recovered == held.sum()


def _broadcast_and_maybe_forward(role, leak: bool) -> list[dict]:
    """Every party adds a contribution to one posterior sum; the active party broadcasts a function of the sum
    (shipped) or, weakened, that with rows 3-5 replaced by party 1's own contribution, which `plain` revealed
    to it. Every role reports its whole view."""
    from falsevfl_secure.runtime.session import barrier
    from falsevfl_secure.transport.rounds import LATENT, POSTERIOR

    role.network.allow({POSTERIOR.name: 1 << 16, LATENT.name: 1 << 16})  # the rounds, as a method declares them
    barrier(role)
    value = (torch.arange(1280, dtype=torch.float32).reshape(40, 32) / 64 - 9.5) * (0.31 + role.rank)
    total = role.backend.sum_to_active(POSTERIOR, value)
    out = None
    if role.is_active:
        out = torch.tanh(total)
        if leak:
            theirs = next(e.value for e in role.view.of("received") if e.peer == 1 and e.round == "posterior")
            out[3:6] = torch.as_tensor(theirs).reshape(40, 32)[3:6]
    role.backend.broadcast(LATENT, out, (40, 32))
    return [{"round": e.round, "kind": e.kind, "peer": e.peer, "protection": e.protection, "value": e.value}
            for e in role.view]


@pytest.mark.parametrize("leak", [False, True])
def test_the_passive_audit_finds_another_partys_rows_in_a_broadcast(leak, attacked):
    """Not vacuous: an active party that forwards three rows of party 1's contribution to the others is caught
    in party 0's and party 2's views (row by row, where the whole broadcast equals nothing); the shipped
    broadcast passes."""
    from falsevfl_secure.runtime.world import run_world

    reports = run_world("plain", PARTIES, _broadcast_and_maybe_forward, (leak,), record=True, timeout_s=90)
    views = {rank: as_view(entries) for rank, entries in enumerate(reports)}
    truth = contributions(views)
    leaks = [leak_ for party in (0, 2) for leak_ in audit_passive_view(views[party], truth, party).leaks]
    attacked("another party's contributions (passive)", "weakened: rows forwarded" if leak else "shipped",
             f"{len(leaks)} leaks: {(leaks or ['none'])[0][:70]}")
    assert all(e.round != "posterior" for e in views[0].of("received"))
    if leak:
        assert leaks == [f"party {p}'s view of 'latent' holds party 1's 'posterior' contribution on 3 rows"
                         for p in (0, 2)]
        # as mpc or he would reveal them (on the 2^-16 grid), and moved to other rows: still found
        moved = np.roll(np.round(truth["posterior"][1] * 2**16) / 2**16, 5, axis=0)[:7]
        weak = View([Entry("latent", "received", ACTIVE, "clear", np.concatenate([moved, moved[:1] * 0]))])
        assert audit_passive_view(weak, truth, 0, atol=ATOL).leaks == [
            "party 0's view of 'latent' holds party 1's 'posterior' contribution on 7 rows"]
    else:
        assert leaks == [] and audit_passive_view(views[1], truth, 1).passed


def _one_posterior_sum(role) -> list[dict]:
    """Every party adds a contribution to one posterior sum (the he aggregator combines them); every role,
    the aggregator included, reports its view."""
    from falsevfl_secure.transport.rounds import POSTERIOR

    if role.is_party:
        value = (torch.arange(1280, dtype=torch.float32).reshape(40, 32) / 64 - 9.5) * (0.31 + role.rank)
        if role.is_active:
            role.backend.declare({POSTERIOR.name: value.numel()})  # the aggregator's bound on each message
        role.backend.sum_to_active(POSTERIOR, value)
    else:
        role.serve_helper()
    return [{"round": e.round, "kind": e.kind, "peer": e.peer, "protection": e.protection, "value": e.value}
            for e in role.view]


def test_the_aggregator_audit_finds_plaintext_behind_the_magic_bytes():
    """Not vacuous: a contribution's float32 (or float64) rows sent to the he aggregator behind the CKKS magic
    bytes, or a blob without them, is caught; the ciphertexts the aggregator received in a real he sum pass."""
    from falsevfl_secure.audit import audit_aggregator_view
    from falsevfl_secure.runtime.world import run_world
    from falsevfl_secure.secure import frames
    from falsevfl_secure.secure.ckks import MESSAGE_MAGIC

    reports = run_world("he", PARTIES, _one_posterior_sum, record=True, timeout_s=120)
    views = {rank: as_view(entries) for rank, entries in enumerate(reports)}
    truth = contributions(views)
    aggregator = views[PARTIES]
    assert aggregator.of("received") and audit_aggregator_view(aggregator, truth).passed
    row = truth["posterior"][1][7]
    for blob, expected in ((MESSAGE_MAGIC + row.astype("<f4").tobytes(), "party 1's 'posterior' contribution"),
                           (MESSAGE_MAGIC + b"pad" + row.astype("<f8").tobytes(), "party 1's 'posterior'"),
                           (b"TEXT" + bytes(64), "something other than ciphertexts")):
        frame = np.frombuffer(frames.encode(frames.Kind.DATA, [blob]), dtype=np.uint8)
        weak = View([*aggregator, Entry("posterior", "received", 1, "clear", frame)])
        report = audit_aggregator_view(weak, truth)
        assert any(expected in leak for leak in report.leaks), report.leaks


@pytest.mark.parametrize("protocol", list(PROTOCOLS))  # labels.toml's protocols
@pytest.mark.parametrize("stage", ["pretrain", "train", "predict"])
@pytest.mark.parametrize("own", ["latent", "latent+own", "latent+mean+own"])  # what the discriminator reads
def test_no_label_dependent_message_reaches_a_passive_party(sessions, stage, own, protocol):
    assert protocol in load_threat_model("labels")["protocols"]
    job = make_job(PARTIES, "II", 16, 3, 5, 0.3, stage, record=True)
    if own != "latent":
        from dataclasses import replace as changed

        job = changed(job, config=job.config.with_options(discriminator_inputs=own))
    session = sessions(protocol, PARTIES)
    original = session.run(job)
    from dataclasses import replace

    for relabel in ("permuted", "constant"):  # the same class counts, and another histogram
        other = session.run(replace(job, relabel=relabel))
        for party in range(PARTIES - 1):
            a = [e for e in original[party]["view"] if e["kind"] == "received"]
            b = [e for e in other[party]["view"] if e["kind"] == "received"]
            assert [e["round"] for e in a] == [e["round"] for e in b]
            assert all(np.array_equal(x["value"], y["value"]) for x, y in zip(a, b, strict=True)), (party, relabel)
            if stage != "pretrain":
                assert [e["round"] for e in a] == ["latent"]


def test_plugvfl_sends_label_dependent_gradients_to_passive_parties(sessions):
    """The disclosure `method = "plugvfl"` makes (threat_models/labels.toml, not_covered): the same attack as
    above succeeds against it, since its fine-tuning broadcasts the label loss's gradient (`embedding_grad`)."""
    job = make_job(PARTIES, "I", 16, 3, 5, 0.3, "train", method="plugvfl", record=True)
    session = sessions("plain", PARTIES)
    original = session.run(job)
    from dataclasses import replace

    for relabel in ("permuted", "constant"):
        other = session.run(replace(job, relabel=relabel))
        for party in range(PARTIES - 1):
            a = {e["round"]: e["value"] for e in original[party]["view"] if e["kind"] == "received"}
            b = {e["round"]: e["value"] for e in other[party]["view"] if e["kind"] == "received"}
            assert "embedding_grad" in a and not np.array_equal(a["embedding_grad"], b["embedding_grad"]), party


@pytest.mark.parametrize("build", ["weakened: context published with its secret key", "shipped"])
def test_aggregator_cannot_decrypt(build, attacked):
    """The aggregator tries to read a passive party's ciphertext with the context it holds: it does when the
    active party's published context carries the secret key; the shipped one has none (and its loader
    refuses one that does)."""
    import tenseal as ts

    from falsevfl_secure.secure.ckks import (
        decrypt_tensors,
        encrypt_tensors,
        load_public_context,
        make_secret_context,
        public_context_bytes,
    )

    secret = make_secret_context()
    value = torch.linspace(-2, 2, 6).reshape(3, 2)
    message = encrypt_tensors(load_public_context(public_context_bytes(secret)), [value])  # a passive party's
    weak = build.startswith("weakened")
    held = ts.context_from(secret.serialize(save_secret_key=True)) if weak else \
        load_public_context(public_context_bytes(secret))
    try:
        seen = decrypt_tensors(held, message, [(3, 2)])[0].float()
        recovered = bool(torch.allclose(seen, value, atol=1e-3))
    except ValueError:
        recovered = False
    attacked("any plaintext (he aggregator)", build, "the contribution read" if recovered else "decryption refused")
    assert recovered == weak
    if not weak:
        assert not held.has_secret_key()
        with pytest.raises(ValueError):
            held.secret_key()
        with pytest.raises(ValueError):  # the weakened context is refused where the aggregator loads one
            load_public_context(secret.serialize(save_secret_key=True))


def test_he_collusion_threshold_active_plus_aggregator_decrypts_individual_contributions():
    """collusion.toml, he: the aggregator's view (individual ciphertexts) plus the active party's secret
    key reveals each contribution; the active party alone only ever receives the sum."""
    from falsevfl_secure.secure.ckks import (
        decrypt_tensors,
        encrypt_tensors,
        load_public_context,
        make_secret_context,
        public_context_bytes,
        sum_encrypted,
    )

    assert "aggregator" in load_threat_model("collusion")["threshold_he"]
    secret = make_secret_context()
    public = load_public_context(public_context_bytes(secret))
    parts = [torch.randn(4, 3, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    aggregator_view = [encrypt_tensors(public, [c], n_addends=3) for c in parts]
    for message, c in zip(aggregator_view, parts, strict=True):  # the coalition decrypts each one
        assert torch.allclose(decrypt_tensors(secret, message, [(4, 3)])[0].float(), c, atol=2.0**-16)
    alone = decrypt_tensors(secret, sum_encrypted(public, aggregator_view), [(4, 3)])[0].float()
    assert torch.allclose(alone, sum(parts), atol=3 * 2.0**-16)
    # alone, the active party (party 2) removes its own addend and splits the rest evenly, its best guess of
    # two exchangeable contributions: off by half their difference, where the coalition read each to 2^-16
    guess = (alone - parts[2]) / 2
    assert min(float((guess - c).abs().max()) for c in parts[:2]) > 0.25


def _difference_as_seen_by_the_aggregator(first: bytes, second: bytes, own) -> np.ndarray:
    """The aggregator's attack on two messages of one party: subtract the ciphertexts and decrypt with a key
    of its own (`own`, same parameters). Both share c_1 only if one encryption of zero went into both: then
    c_1 cancels and its key reads the difference of the values; otherwise it reads noise of size q."""
    from falsevfl_secure.secure import ckks
    from falsevfl_secure.secure.ckks_seal import seal_tools

    seal = seal_tools(own)
    a, b = (ckks._load_message(own, m, 0)[0][0] for m in (first, second))
    seal.evaluator.add_inplace(a, seal.encrypt(np.zeros(ckks.values_per_ciphertext(own))))  # keeps c_1 non-zero
    seal.evaluator.sub_inplace(a, b)
    return seal.decrypt(a)


@pytest.mark.parametrize("build", ["shipped", "weakened"])
def test_pooled_zeros_are_single_use_so_two_ciphertexts_never_give_away_their_difference(build, attacked):
    """aggregator_he.toml: each ciphertext is a fresh encryption of zero plus the values. A weakened pool
    that hands one encryption of zero out twice lets the aggregator read the difference of two messages
    with a key of its own; against the shipped pool the same attack reads values of size ~6e13 (2^45)."""
    from falsevfl_secure.secure import ckks
    from falsevfl_secure.secure.ckks_seal import save_ciphertext

    secret = ckks.make_secret_context()
    public = ckks.load_public_context(ckks.public_context_bytes(secret))

    class Reusing(ckks.ZeroPool):
        def take(self, n: int) -> list:
            self._kept = getattr(self, "_kept", None) or save_ciphertext(self._tools.zero())
            return [ckks._ciphertext(public, memoryview(self._kept), "kept") for _ in range(n)]

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, generator=g, dtype=torch.float64), torch.randn(100, generator=g, dtype=torch.float64)
    with (ckks.ZeroPool(public, idle=False) if build == "shipped" else Reusing(public, idle=False)) as pool:
        first = ckks.encrypt_tensors(public, [x], n_addends=4, zeros=pool)
        deadline = time.monotonic() + 120
        while build == "shipped" and not len(pool) and time.monotonic() < deadline:
            time.sleep(0.05)  # the second message on a zero the helper made ahead
        second = ckks.encrypt_tensors(public, [y], n_addends=4, zeros=pool)
    read = _difference_as_seen_by_the_aggregator(first, second, ckks.make_secret_context())[:100]
    error = float(np.abs(read - (x - y).numpy()).max())
    attacked("encryption of zero used twice (aggregator)", build, f"difference of two messages read to {error:.3g}")
    if build == "weakened":
        assert error < 1e-4
    else:
        assert error > 1e12  # noise of the size of q, not a value


def _simulate(tmp_path: Path, protocol: str, name: str):
    import json

    from falsevfl_secure.simulate import main

    out = tmp_path / name
    argv = ["--protocol", protocol, "--runtime", "distributed", "--parties", "4", "--preset", "quick",
            "--pretrain-epochs", "1", "--train-epochs", "2", "--quiet", "--audit", "--out", str(out)]
    assert main(argv) == 0, protocol  # plain fails its audit as expected, and that is no error
    return json.loads((out / "result.json").read_text())["audit"], out


def test_a_recorded_training_run_is_audited_and_the_audit_is_not_vacuous(tmp_path):
    """`simulate --audit`: every role of a real distributed run records its view of one probe step; the
    secure protocols pass the audit, plain fails it, and two runs with the same public seed record
    different active-party views (every secret is drawn afresh)."""
    audits = {}
    for protocol in PROTOCOLS:
        audits[protocol], out = _simulate(tmp_path, protocol, protocol)
        assert sorted(p.name for p in (out / "views").glob("rank*.npz")) == [
            f"rank{r}.npz" for r in range(4 + len(PROTOCOLS[protocol].helpers))]
    for protocol in (p for p in PROTOCOLS if PROTOCOLS[p].hides_contributions):
        assert audits[protocol]["passed"], audits[protocol]["leaks"]
        assert audits[protocol]["entries_checked"] >= 3 + 3 * 3  # active: 3 sums; passive: 3 broadcasts each
    assert audits["he"]["views_audited"] == 5  # four parties and the aggregator
    assert audits["mpc"]["shares_uniform"] and audits["mpc"]["shares_tested"] >= MIN_SHARE_VALUES
    assert not audits["plain"]["passed"] and audits["plain"]["leaks_found"] >= 3
    _, again = _simulate(tmp_path, "mpc", "mpc-again")
    from falsevfl_secure.transport.views import load_view

    first, second = (load_view(folder / "views" / f"rank{ACTIVE}.npz") for folder in (tmp_path / "mpc", again))
    rounds = [[e for e in view if e.kind in ("received", "revealed")] for view in (first, second)]
    assert [e.round for e in rounds[0]] == [e.round for e in rounds[1]]
    assert not any(np.array_equal(a.value, b.value) for a, b in zip(*rounds, strict=True))
    controls = [sorted((e.round, e.peer, e.value.tobytes()) for e in view.of("control")) for view in (first, second)]
    assert [c[:2] for c in controls[0]] == [c[:2] for c in controls[1]]  # the same set-up steps, fresh contents
    assert not set(c[2] for c in controls[0]) & set(c[2] for c in controls[1])


def test_audit_of_recorded_views_needs_enough_shares():
    """A recorded mpc step whose shares are too few to test fails the audit (it is not skipped)."""
    small = View()
    small.add("posterior", "sent", ACTIVE, "secret-shared", np.zeros((2, 4), dtype=np.float32))
    small.add("posterior", "received", 0, "secret-shared", np.zeros(9, dtype=np.int64))
    views = {ACTIVE: small, **{k: View() for k in range(PARTIES - 1)}}
    audit = audit_recorded_views(views, PARTIES, ACTIVE, "mpc")
    assert not audit["passed"] and "too few" in audit["leaks"][0]


def test_the_probe_step_leaves_parameters_and_random_streams_as_they_were():
    """--audit's probe step must not change the training that follows."""
    import torch

    from falsevfl_secure.data import make_splits
    from falsevfl_secure.methods import build_node, make_config
    from falsevfl_secure.train import host_split, probe_step
    from falsevfl_secure.transport import LocalTransport

    cfg = make_config("digits", "quick", variant="II")
    dataset, split, _ = make_splits(cfg, ())
    cpu = torch.device("cpu")
    node = build_node(cfg, {k: b.shape[1] for k, b in enumerate(split.blocks)}, dataset.n_classes,
                      LocalTransport(cfg.parties, cfg.active_index), cpu)
    data = host_split(split.view(range(cfg.parties), True), cpu, dataset.n_classes)
    modules = node.modules()
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]
    streams = [rand.state() for rand in node.randomness()]
    probe_step(node, data)
    stage1 = METHODS["false-vfl"].rounds.step(Stage.PRETRAIN)
    assert node.transport.log.trace == [r.name for r in stage1]  # it did run the rounds of a stage-1 step
    for module, state in zip(modules, before, strict=True):
        assert all(torch.equal(v, state[k]) for k, v in module.state_dict().items())
        assert all(p.grad is None for p in module.parameters())
    assert [rand.state() for rand in node.randomness()] == streams


def _contribute_and_maybe_leak(role, leak: str) -> list[dict]:
    """Every party adds a contribution to one posterior sum; with `leak` (a weakened build on both sides, as the
    peak counters of the earlier build were), party 0 then sends the active party its largest value and a row
    of its contribution in a message outside the round table (`leak` is its tag), and the active party reads
    it. Every role reports its whole view."""
    from falsevfl_secure.transport.rounds import POSTERIOR

    value = (torch.arange(1280, dtype=torch.float32).reshape(40, 32) / 64 - 9.5) * (0.31 + role.rank)
    if leak == "stats":  # weakened on both sides: the shipped network refuses an undeclared tag at once
        from falsevfl_secure.runtime.session import barrier

        role.network.bounds[leak] = (1 << 20, 2)
        barrier(role)  # every role accepts the tag before party 0 sends it
    role.backend.sum_to_active(POSTERIOR, value)
    tag = leak.split("-")[0]
    if leak == "resume-text" and role.rank == 0:  # its peak alone, written as text in a declared step
        role.peers.send(role.peers.active_index, tag, json.dumps({"peak": float(value.abs().max())}).encode())
    elif leak and role.rank == 0:
        peak = value.abs().max().reshape(1)  # a late row, as float64: the audit reads every row in both widths
        role.peers.send(role.peers.active_index, tag, torch.cat([peak, value[37]]).double().numpy().tobytes())
    elif leak and role.is_active:
        role.peers.recv(0, tag)
    return [{"round": e.round, "kind": e.kind, "peer": e.peer, "protection": e.protection, "value": e.value}
            for e in role.view]


@pytest.mark.parametrize("leak", ["", "stats", "resume", "resume-text"])
def test_the_audit_checks_everything_received_not_only_the_rounds(leak, attacked):
    """A weakened party that sends values outside the rounds is caught: in an undeclared message ("stats"),
    or inside a declared control step ("resume": a row; "resume-text": its peak alone, as JSON text); the
    shipped build's views pass."""
    from falsevfl_secure.runtime.world import run_world

    reports = run_world("mpc", PARTIES, _contribute_and_maybe_leak, (leak,), record=True, timeout_s=90)
    views = {rank: as_view(entries) for rank, entries in enumerate(reports)}
    audit = audit_recorded_views(views, PARTIES, ACTIVE, "mpc")
    attacked("values outside the round table (active)", f"weakened: {leak!r} message" if leak else "shipped",
             f"{audit['leaks_found']} leaks: {(audit['leaks'] or ['none'])[0][:70]}")
    if not leak:
        assert audit["passed"] and any(e.kind == "control" for e in views[ACTIVE]), audit["leaks"]
    elif leak == "stats":
        assert any("undeclared message 'stats'" in text for text in audit["leaks"]), audit["leaks"]
    else:
        assert any("carries party 0's 'posterior' contribution" in text for text in audit["leaks"]), audit["leaks"]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(2, 16), st.floats(1e-3, 1e6), st.integers(0, 2**32 - 1),
       st.sampled_from(["value", "peak", "norm"]), st.sampled_from(["text", "float64"]))
def test_a_single_number_of_a_contribution_is_found_in_a_control_payload(rows, width, scale, seed, which, form):
    """The control audit's scalar check: any one value, a row's peak or norm, written as JSON text or as float64
    bytes at any offset, is found; the same payload with the number moved in its fourth digit is not, nor a
    count, nor an array of integer positions (whose bytes hold short binary fractions at odd offsets)."""
    from falsevfl_secure.audit import _in_bytes, _in_text, _statistics, _words

    value = (np.random.default_rng(seed).standard_normal((rows, width)) * scale).astype(np.float32)
    stats = _statistics(value, "posterior")

    def carries(payload: bytes) -> bool:
        return _in_bytes(payload, _words(stats)) or _in_text(payload, stats)

    pick = {"value": value[rows // 2, width - 1], "peak": np.abs(value[0]).max(),
            "norm": np.linalg.norm(value.astype(np.float64), axis=1)[-1]}[which]  # bytes: found when bit-equal
    leaked = float(pick)
    assume(leaked != round(leaked) and len(repr(leaked).replace("-", "").lstrip("0.").replace(".", "")) >= 7)
    moved = leaked * (1 + 1e-3)
    if form == "text":
        payload, wrong = (json.dumps({"epoch": 3, "rows": rows, "x": x}).encode() for x in (leaked, moved))
    else:
        assume(_words(np.array([leaked])).size)  # a value of few significant bits is not looked for as bytes
        payload, wrong = (b"k" * (seed % 8) + np.float64(x).tobytes() + b"tail" for x in (leaked, moved))
    assert carries(payload)
    assert not carries(wrong) or bool(np.isclose(stats, moved, rtol=1e-6).any())
    assert not carries(json.dumps({"epoch": 3, "rows": rows}).encode())
    assert not carries(np.arange(0, 40000, dtype="<i8").tobytes())



def test_what_the_latent_broadcast_discloses_is_there_at_a_small_scale():
    """passive_semi_honest.toml's disclosed-by-design figures (bench/disclosure.py) measured again on a short
    digits schedule (30 + 20 epochs): party 0, knowing 40 labels or party 1's features on 100 rows, infers from
    the h it received far more than from its own block. The statement is that this is large and unprotected; a
    build that stopped broadcasting h, or a weaker attacker, would fail here and the file's numbers with it."""
    import sys
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import disclosure as bench

    from falsevfl_secure.data import make_splits
    from falsevfl_secure.methods import make_config
    from falsevfl_secure.runtime.local import run_local

    assert load_threat_model("passive_semi_honest")["disclosed_by_design"][0]["digits"].startswith("61.3")
    cfg = make_config("digits", "quick", seed=0, device="cpu")
    cfg = replace(cfg, pretrain=replace(cfg.pretrain, epochs=30), train=replace(cfg.train, epochs=20))
    nodes: list = []
    run_local(cfg, (bench.TEST_PATTERN,), progress=False, keep=nodes)
    data, train, tests = make_splits(cfg, (bench.TEST_PATTERN,))
    splits = {"train": train, "test": tests[bench.TEST_PATTERN]}
    seen = {k: bench.attacker_inputs(bench.received_latents(nodes[0], s.view(range(cfg.parties), True),
                                                            data.n_classes), s.blocks[bench.PASSIVE])
            for k, s in splits.items()}
    inputs = {k: (seen["train"][k], seen["test"][k]) for k in ("h mean", "x_p")}
    held, rng = ~train.missing, np.random.default_rng([0, 7])
    labels = bench.label_attack(inputs, train.y, splits["test"].y, np.flatnonzero(held[:, bench.PASSIVE]), 40, 5,
                                rng)
    both = np.flatnonzero(held[:, bench.PASSIVE] & held[:, bench.OTHER])
    features = bench.feature_attack(inputs, train.blocks[bench.OTHER], splits["test"].blocks[bench.OTHER], both,
                                    100, 5, rng)
    label_gain = np.mean(labels["h mean"]) - np.mean(labels["x_p"])
    feature_gain = np.mean(features["h mean"]) - np.mean(features["x_p"])
    print(f"label inference +{label_gain:.1f} pp, feature inference R^2 +{feature_gain:.3f} over the own block")
    assert label_gain > 10 and feature_gain > 0.2, (labels, features)


def _hostile_announcements(held: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A malicious active party's `kept` lists, one per passive party, all of one length and each accepted on its
    own: B's are records it shares with C or D; C's and D's, in the same slots, records they do not hold."""
    shared = np.flatnonzero(held["B"] & (held["C"] | held["D"]))
    lists = {"B": shared, "C": np.flatnonzero(~held["C"]), "D": np.flatnonzero(~held["D"])}
    n = min(v.size for v in lists.values())
    return {party: v[:n] for party, v in lists.items()}


@pytest.mark.parametrize("protocol", SECURE)
def test_split_records_would_give_a_malicious_active_party_one_holders_contribution(protocol, attacked):
    """malicious_pinned_party.toml, what the passive parties' checks prevent (a red team's finding): the active
    party alone sorts the shared order and announces each passive party's positions and kept rows. Here it signs
    each party a different `kept` list of one length; each passive party's own checks of its own view accept it;
    in every slot only B holds its record, so every revealed sum is B's own contribution on records B shares with
    C or D. The federation refuses such rows before any sum (the checks, next test); this is what it would
    lose without it."""
    import hashlib

    from falsevfl_secure.federation.aligned import check_announcement
    from falsevfl_secure.secure import frames
    from falsevfl_secure.secure.identity import generate, public_bytes, sign, verify
    from falsevfl_secure.transport.protocols import protocol_named
    from falsevfl_secure.transport.rounds import POSTERIOR
    from falsevfl_secure.transport.sums import sum_in_process

    rng = np.random.default_rng(0)  # the parties' data, not a secret
    union, active_key, session, empty = 400, generate(), bytes(32), b""
    held = {p: rng.random(union) < 0.8 for p in "BCD"}  # each passive party holds 80 % of the records
    value = {p: rng.normal(size=(union, 4)) for p in "BCD"}  # a contribution per record (posterior terms)
    accepted = {}
    for party, kept in _hostile_announcements(held).items():  # signed over its receiver's name, as _announce does
        frame = frames.encode(frames.Kind.DATA, [kept.astype("<i8").tobytes(), empty, empty,
                                                 np.array([held[party].sum()] * 2, dtype="<i8").tobytes(), empty])
        signed = session + party.encode() + b"\0" + hashlib.sha256(frame).digest()
        verify(public_bytes(active_key), "kept rows", signed, sign(active_key, "kept rows", signed), "A")
        accepted[party] = check_announcement(frame, 3, union, int(held[party].sum()), 4)[0]
    assert not np.array_equal(accepted["B"], accepted["C"])  # different lists, each accepted by its receiver
    slots = [torch.from_numpy(np.where(held[p][accepted[p]][:, None], value[p][accepted[p]], 0.0)).float()
             for p in "BCD"]
    ciphers, helper = protocol_named(protocol).in_process(4, active=3)
    total = sum_in_process(POSTERIOR, [*slots, torch.zeros_like(slots[0])], ciphers, helper, active=3).double()
    truth = torch.from_numpy(value["B"][accepted["B"]])
    exact = int(((total - truth).abs().amax(1) < 2.0**-14).sum())
    shared = int((held["C"] | held["D"])[accepted["B"]].sum())
    attacked("split shared records (malicious active)", f"weakened: no checks, {protocol}",
             f"B's own contribution in {exact} of {len(truth)} slots, {shared} of them records B shares")
    assert exact == shared == len(truth) > 50  # disclosed: every slot, each a record another passive party holds


def _hostile_active(role, variant: str) -> None:
    """Make this (active) process split shared records: `kept` announces B the records it shares with C and C,
    in the same slots, records it does not hold; `keyed` returns C its keyed points (by which the union is sorted)
    with those of two records it shares with B exchanged (under the proof of the true ones); `union` publishes C
    another union than B, of one size (a first record added, a last one C does not hold dropped: C's records
    before it one row on)."""
    from types import SimpleNamespace

    from falsevfl_secure.federation import aligned
    from falsevfl_secure.secure import align as align_module
    from falsevfl_secure.secure import dleq, ring

    b, c = (r for r in range(role.peers.n_parties) if r != role.peers.active_index)
    if variant in ("keyed", "union"):
        real_order, real_send, sent = align_module._shared_order, ring.Wire.send, {}

        def split_order(lists, counts, active, restrict):
            positions, holders, union = real_order(lists, counts, active, restrict)
            shared = np.flatnonzero(np.isin(positions[c], np.flatnonzero(holders[:, b] & holders[:, c])))[:2]
            points = [lists[c][32 * i:32 * i + 32] for i in range(int(counts[c]))]
            points[shared[0]], points[shared[1]] = points[shared[1]], points[shared[0]]
            lists[c] = b"".join(points) if variant == "keyed" else lists[c]
            drop = int(np.flatnonzero(~holders[:, c])[-1])  # a record C does not hold: C cannot miss it
            sent[union] = bytes(31) + b"\x01" + union[:32 * drop] + union[32 * drop + 32:]
            return positions, holders, union

        def send(self, dst, payload):
            if variant == "union" and dst == c and payload in sent:
                payload = sent[payload]
            return real_send(self, dst, payload)

        align_module._shared_order, ring.Wire.send = split_order, send
        ring._prove = lambda state, hop, part: dleq.prove(state.scalar, state.context(hop), part[64:])  # any M
        return
    real_align, real_announce, seen = aligned.align, aligned._announce, {}
    aligned.align = lambda *a, **k: seen.setdefault("result", real_align(*a, **k))

    def announce(role, kept, labeled, validation, per_party, short, result):
        h = seen["result"].holders
        lists = {b: np.flatnonzero(h[:, b] & h[:, c]), c: np.flatnonzero(~h[:, c])}
        n = min(v.size for v in lists.values())
        for rank, chosen in lists.items():  # each its own list, signed over its own name as _announce signs
            peers = SimpleNamespace(n_parties=role.peers.n_parties, active_index=role.peers.active_index,
                                    names=role.peers.names, send=lambda dst, *a, r=rank: dst == r and
                                    role.peers.send(dst, *a))
            real_announce(SimpleNamespace(key=role.key, session=role.session, peers=peers), chosen[:n],
                          chosen[:0], chosen[:0], per_party, short, result)

    aligned._announce = announce


def _weaken(variant: str) -> None:
    """The build before: each party checks its own view only (no comparison, no proofs checked, no transcript)."""
    from falsevfl_secure.federation import aligned
    from falsevfl_secure.secure import align as align_module

    aligned._compare_with_passive_peers = lambda role, *args: role.peers.send(role.peers.active_index, "kept-ack", b"")
    align_module.check_hops = lambda *args: None
    align_module.keyed.verify = lambda *args: True
    real_digest = aligned.common_digest
    aligned.common_digest = lambda *args: real_digest(*args[:6])


def _split_party(role, inputs: list, variant: str, checked: bool, restrict: bool) -> dict:
    """One party process of an alignment (for training, or with `restrict` for prediction) whose active party
    splits shared records (`_hostile_active`); without `checked` the passive parties skip their checks (the
    weakened build)."""
    from falsevfl_secure.federation import aligned

    if role.is_active:
        _hostile_active(role, variant)
    if not checked:
        _weaken(variant)
    mine = inputs[role.rank]
    result = aligned.align_table(role, mine.table.ids, mine.block.held, None, restrict)
    return {"ids": list(mine.table.ids), "positions": result.positions}


@pytest.mark.parametrize("variant, checked, restrict", [("kept", False, False), ("kept", True, False),
                                                       ("keyed", False, False), ("keyed", True, False),
                                                       ("union", False, False), ("union", True, False),
                                                       ("keyed", True, True)])
def test_the_passive_parties_refuse_an_active_party_that_splits_the_records_they_share(tmp_path, variant, checked,
                                                                                         restrict, attacked):
    """malicious_pinned_party.toml: a malicious active party places records two passive parties both hold at
    different rows for each (by the `kept` announcement, by the pseudonyms it returns one of them, or by the
    union it publishes one of them). Real party processes over the pinned links. Without the checks (weakened:
    no comparison of the signed announcements, no hop proofs checked, no transcript) both accept and the records
    they share sit at different rows (the previous test reads B's contribution from such rows); shipped, they
    refuse before any sum (for training and for prediction), and the run names the active party."""
    from falsevfl_secure.federation.config import load_federation
    from falsevfl_secure.federation.inputs import read_training_table
    from falsevfl_secure.federation.tables_demo import Spec, write_federation
    from falsevfl_secure.runtime.world import WorkerError, run_world

    written = write_federation(tmp_path, Spec())
    fed = load_federation(written.path)
    inputs = [read_training_table(fed, name) for name in fed.names]
    active = fed.names.index(fed.active)
    build, args = "shipped" if checked else "weakened: no checks", (inputs, variant, checked, restrict)
    attack = f"split shared records by {variant}{' for prediction' if restrict else ''} (malicious active)"
    if checked:
        with pytest.raises(WorkerError) as refused:
            run_world("plain", 3, _split_party, args, timeout_s=120, active_index=active)
        attacked(attack, build, "refused before any sum")
        said = {"kept": "the active party 'party0' signed other rows to this party than to",
                "union": "the active party 'party0' signs another digest than its rows",
                "keyed": "from 'party0': its keyed pseudonyms fail their proof"}[variant]
        assert said in str(refused.value) and "party0" in str(refused.value), refused.value
        return
    out = run_world("plain", 3, _split_party, args, timeout_s=120, active_index=active)
    rows = [dict(zip(o["ids"], o["positions"].tolist(), strict=True)) for k, o in enumerate(out) if k != active]
    placed = [i for i in set(rows[0]) & set(rows[1]) if max(rows[0][i], rows[1][i]) >= 0]  # in the order for one
    split = sum(1 for i in placed if rows[0][i] != rows[1][i])
    attacked(attack, build, f"{split} of the {len(placed)} placed records both hold sit at different rows, accepted")
    assert split == {"kept": len(placed), "keyed": 2}.get(variant, split) and split > 0 and len(placed) > 20
