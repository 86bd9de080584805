"""A privacy claim is an attack that fails: each adversary of threat_models/ tries, succeeds against a
deliberately weakened build (weak mask keys, secrets that follow from the public seed, pickled frames)
and fails against the shipped one. The runs are real: role processes over the authenticated gRPC links, real
masks, real CKKS."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attacks import (
    WeakAgreement16,
    invert_encoders,
    pickle_payload,
    public_seed_noise,
    public_seed_party,
    relative_error,
    search_mask_key,
)

from falsevfl_secure.config import Config, Stage, StageConfig
from falsevfl_secure.data.synthetic import synthetic_split
from falsevfl_secure.runtime.session import StepJob
from falsevfl_secure.runtime.world import WorkerError, run_world
from falsevfl_secure.secure.masks import X25519Agreement
from falsevfl_secure.secure.mpc_sum import secure_sum
from falsevfl_secure.transport.protocols import He, Mpc

K, ACTIVE, WIDTH = 4, 3, 5
PAIR_KEYS: dict[int, bytes] = {}


# -- mask-key search: the active party tries to remove a passive party's mask -------------------------


class _Remember:
    def pair_keys(self, rank, public_keys, transcript=None, purpose="secure-sum"):
        keys = super().pair_keys(rank, public_keys, transcript, purpose)
        if purpose == "secure-sum":
            PAIR_KEYS.clear()
            PAIR_KEYS.update(keys)
        return keys


class WeakRecording(_Remember, WeakAgreement16):
    """The weakened build's agreement, remembering its keys (what the active party knows of its own)."""


class ShippedRecording(_Remember, X25519Agreement):
    """The shipped agreement, remembering its keys."""


def _input(rank: int) -> torch.Tensor:  # 512 values: enough for the correlation bound below to be tight
    return torch.linspace(-3, 3, 512).reshape(64, 8) * (rank + 1)


def _sum_once(role) -> dict:
    view: list = []
    secure_sum(_input(role.rank), 2, role.backend.cipher.shares, role.peers, view=view)
    keys = {str(k): v.hex() for k, v in PAIR_KEYS.items()}
    return {"shares": {str(s.src): s.raw.numpy() for s in view}, "keys": keys}


def _search_from_the_active_party(reports: list[dict]) -> np.ndarray | None:
    """Party 2 (active) unmasks party 0: it knows its own key with 0 and searches the 16-bit space for
    the key of 0 with 1 (party 0 adds + both streams: 1 and 2 rank above it)."""
    from falsevfl_secure.randomness import KeyStream

    share = reports[2]["shares"]["0"]
    known = KeyStream(bytes.fromhex(reports[2]["keys"]["0"])).integers(share.size)
    return search_mask_key(share, known, sign=+1)


@pytest.mark.parametrize("build", ["weak 16-bit keys", "shipped X25519 keys"])
def test_mask_key_search_by_the_active_party(build, attacked):
    agreement = WeakRecording if build.startswith("weak") else ShippedRecording
    reports = run_world(Mpc(agreement=agreement), 3, _sum_once, timeout_s=90)
    recovered = _search_from_the_active_party(reports)
    truth = _input(0).reshape(-1).double()
    found = "no key fits" if recovered is None else f"max error {np.abs(recovered[:-1] - truth.numpy()).max():.1e}"
    attacked("mask-key search (active, 2^16 keys)", build, found)
    if build.startswith("weak"):
        assert recovered is not None and np.abs(recovered[:-1] - truth.numpy()).max() < 1e-4
    else:
        assert recovered is None  # no key in the searched space fits: nothing better than the mean
        share = reports[2]["shares"]["0"][:-1].astype(np.float64)
        # The masked share says nothing: its correlation with the input is that of a uniform share, |r| within
        # Fisher's z at 4.9 standard errors (a false alarm once in a million runs; an unmasked share has r = 1).
        # At these 512 values the bound is 0.21 (at the 24 values before, 0.79: only a near-unmasked share failed).
        bound = np.tanh(4.9 / np.sqrt(share.size - 3))
        assert abs(np.corrcoef(share, truth.numpy())[0, 1]) < bound < 0.25


# -- inversion with known weights: the active party inverts the revealed posterior sum -----------------


def attack_job(secret_seed: int | None, n: int = 64, p_missing: float = 0.3) -> StepJob:
    cfg = Config(dataset="synthetic", parties=K, h_dim=16, z_dim=4, party_hidden=32, global_hidden=16,
                 discriminator_hidden=16, kappa=2, pretrain=StageConfig(1e-3, n, 1), seed=3)
    split = dict(n=n, parties=K, width=WIDTH, p_missing=p_missing, seed=3)
    return StepJob(cfg, split, tuple(range(n)), Stage.PRETRAIN, secret_seed=secret_seed, record=True)


def _posterior(view: list[dict], kind: str) -> dict[int, torch.Tensor]:
    return {e["peer"]: torch.as_tensor(e["value"]).float() for e in view
            if e["round"] == "posterior" and e["kind"] == kind}


def invert_active_view(job: StepJob, view: list[dict], individually: bool) -> float:
    """What the active party reconstructs of the passive parties' features on the rows it may not learn
    them for (rows two or more passive parties hold), from encoders rebuilt from the public seed."""
    split = synthetic_split(**job.split)
    held = torch.as_tensor(~split.missing)
    passive = [k for k in range(K) if k != ACTIVE]
    encoders = [public_seed_party(job.config, k, WIDTH) for k in passive]
    own = _posterior(view, "sent")[ACTIVE]
    if individually:  # plain: every contribution arrives on its own
        received = _posterior(view, "received")
        xs = [invert_encoders([enc], held[:, [k]], received[k])[0] for enc, k in zip(encoders, passive, strict=True)]
    else:
        revealed = _posterior(view, "revealed")[-1]
        xs = invert_encoders(encoders, held[:, passive], revealed - own)
    rows = held[:, passive].sum(1) >= 2
    errors = [relative_error(x[rows & held[:, k]], torch.as_tensor(split.blocks[k])[rows & held[:, k]],
                             torch.as_tensor(split.blocks[k])[held[:, k]]) for x, k in zip(xs, passive, strict=True)]
    return float(np.mean(errors))


@pytest.mark.parametrize(("protocol", "build"), [("plain", "public-seed"), ("mpc", "public-seed"),
                                                 ("he", "public-seed"), ("mpc", "shipped"), ("he", "shipped")])
def test_inversion_of_the_posterior_sum_with_rebuilt_encoders(sessions, protocol, build, attacked):
    job = attack_job(3 if build == "public-seed" else None)  # the weak build: secrets from the public seed (3)
    view = sessions(protocol, K).run(job)[ACTIVE]["view"]
    error = invert_active_view(job, view, individually=protocol == "plain")
    attacked("inversion of the posterior sum (active)", f"{protocol}, {build}", f"relative error {error:.2f}")
    if build == "public-seed":
        assert error < 0.5, error  # the weights are known: the features come back
    else:
        assert error > 0.8, error  # at the level of guessing the feature mean (1.0)


# -- a passive party regenerates the active party's latent noise ---------------------------------------


def _aggregated_posterior(reports: dict, job: StepJob) -> tuple[torch.Tensor, torch.Tensor]:
    """The truth the attack is after: mean and std of q(h | x_obs) per row, from every party's own terms."""
    split = synthetic_split(**job.split)
    total = sum(_posterior(reports[k]["view"], "sent")[k] for k in range(K))
    n_observed = torch.as_tensor((~split.missing).sum(1), dtype=torch.float32).unsqueeze(-1)
    h = job.config.h_dim
    return total[:, :h] / n_observed, total[:, h:].rsqrt()


@pytest.mark.parametrize("build", ["public-seed", "shipped"])
def test_passive_party_regenerates_the_active_partys_latent_noise(sessions, build, attacked):
    job = attack_job(3 if build == "public-seed" else None, n=200, p_missing=0.5)
    reports = sessions("plain", K).run(job)
    latent = next(torch.as_tensor(e["value"]) for e in reports[0]["view"] if e["round"] == "latent")
    eps = public_seed_noise(job.config, ACTIVE).normal(tuple(latent.shape))
    std = (latent[0] - latent[1]) / (eps[0] - eps[1])  # h_j = mean + std * eps_j, two samples suffice
    mean = latent[0] - std * eps[0]
    true_mean, true_std = _aggregated_posterior(reports, job)
    mean_error = float(((mean - true_mean).abs() / true_std).median())
    split = synthetic_split(**job.split)
    rows = torch.as_tensor((~split.missing[:, [0, 1]]).all(1) & split.missing[:, [2, 3]].all(1))
    own = _posterior(reports[0]["view"], "sent")[0]
    h = job.config.h_dim
    target = torch.cat([2 * mean - own[:, :h], std.pow(-2) - own[:, h:]], dim=-1)[rows]  # party 1's terms
    x = invert_encoders([public_seed_party(job.config, 1, WIDTH)], torch.ones(int(rows.sum()), 1, dtype=torch.bool),
                        target)[0]
    feature_error = relative_error(x, torch.as_tensor(split.blocks[1])[rows],
                                   torch.as_tensor(split.blocks[1])[~split.missing[:, 1]])
    attacked("latent noise regeneration (passive)", build,
             f"mean error {mean_error:.1e} std, feature error {feature_error:.2f}")
    if build == "public-seed":
        assert mean_error < 1e-3 and feature_error < 0.5, (mean_error, feature_error)
        return
    assert mean_error > 0.3 and feature_error > 0.8, (mean_error, feature_error)
    # Many samples approach the posterior itself (disclosed by design: 50 a row at prediction); even given it
    # exactly, the other party's features stay behind its secret weights.
    exact = torch.cat([2 * true_mean - own[:, :h], true_std.pow(-2) - own[:, h:]], dim=-1)[rows]
    x = invert_encoders([public_seed_party(job.config, 1, WIDTH)], torch.ones(int(rows.sum()), 1, dtype=torch.bool),
                        exact)[0]
    exact_error = relative_error(x, torch.as_tensor(split.blocks[1])[rows],
                                 torch.as_tensor(split.blocks[1])[~split.missing[:, 1]])
    attacked("latent noise regeneration (passive)", "shipped, given the exact posterior",
             f"feature error {exact_error:.2f}")
    assert exact_error > 0.8, exact_error


# -- nothing another role sends is unpickled --------------------------------------------------------


def _pickle_to_the_aggregator(role, payload: bytes):
    if role.rank == 0:
        role.peers.send(2, "posterior", payload)  # a passive party's "ciphertexts"
    elif role.is_active:
        role.backend.declare({"posterior": 12})  # the sum's size, as a transport declares it
    elif not role.is_party:
        role.serve_helper()


def _pickle_to_the_active_party(role, payload: bytes):
    from falsevfl_secure.transport.rounds import POSTERIOR

    if not role.is_party:
        role.peers.send(1, "posterior", payload)  # the aggregator's "encrypted sum"
    elif role.is_active:
        role.backend.sum_to_active(POSTERIOR, torch.zeros(3, 4))


def _nothing(role) -> None:
    """The roles' work once the hostile start-up has run: nothing."""


class HostileContext(He):
    """An active party that sends a pickle where its public context belongs, signed with its own pinned key
    (so that it passes the signature check and reaches the parser)."""

    def open(self, m):
        from falsevfl_secure.network.handshake import send_context

        if m.rank == m.active_index:
            send_context(m.peers.network, m.key, m.session, self.payload)
            return None
        return super().open(m)


@pytest.mark.parametrize("receiver", ["aggregator", "active party", "passive party and aggregator"])
def test_a_pickle_payload_is_refused_by_every_receiving_role_without_running(tmp_path, receiver):
    marker = tmp_path / "pwned"
    payload = pickle_payload(marker)
    if receiver == "aggregator":
        call = (He(), _pickle_to_the_aggregator, (payload,))
    elif receiver == "active party":
        call = (He(), _pickle_to_the_active_party, (payload,))
    else:
        hostile = HostileContext()
        object.__setattr__(hostile, "payload", payload)
        call = (hostile, _nothing, ())
    with pytest.raises(WorkerError, match="frame|context"):
        run_world(call[0], 2, call[1], call[2], timeout_s=60)
    assert not marker.exists()


def test_files_from_other_processes_are_never_unpickled(tmp_path):
    """Views, packed reports, job files and checkpoints written by another process are data only."""
    from falsevfl_secure.checkpoint import Checkpointer
    from falsevfl_secure.errors import FalseVflError
    from falsevfl_secure.runtime import codec
    from falsevfl_secure.runtime.records import Job
    from falsevfl_secure.transport.views import load_view

    marker = tmp_path / "pwned"
    payload = pickle_payload(marker)
    (tmp_path / "rank1.npz").write_bytes(payload)
    (tmp_path / "job.json").write_bytes(payload)
    (tmp_path / "party0-stage1-epoch00000.pt").write_bytes(payload)
    for attempt in (lambda: load_view(tmp_path / "rank1.npz"), lambda: codec.unpack(payload),
                    lambda: Job.read(tmp_path / "job.json"),
                    lambda: Checkpointer(tmp_path, 0).load((Stage.PRETRAIN, 0))):
        with pytest.raises(FalseVflError):
            attempt()
    assert not marker.exists()
