"""Test-only adversaries: what a semi-honest party can do with what it receives and everything it knows.

Each attack here is run against a deliberately weakened build, where it must succeed, and against the
shipped one, where it must fail (tests/test_attacks.py). Nothing here is used by the package.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import torch

from falsevfl_secure.config import Config
from falsevfl_secure.model import ActiveModel, PartyModel, initialise
from falsevfl_secure.randomness import KeyStream, RoleSecret
from falsevfl_secure.secure.masks import X25519Agreement

# -- weak builds -------------------------------------------------------------------------------------


class WeakAgreement16(X25519Agreement):
    """A deliberately broken key agreement: the pair keys carry 16 bits of entropy (the X25519 secret is
    cut to its first two bytes), like masks from a small seed. Test-only; never registered."""

    def pair_keys(self, rank, public_keys, transcript=None, purpose="secure-sum"):
        keys = super().pair_keys(rank, public_keys, transcript, purpose)
        return {peer: weak_key(key[:2]) for peer, key in keys.items()}


def weak_key(seed: bytes) -> bytes:
    return hashlib.sha256(b"weak:" + seed).digest()


def public_seed_party(cfg: Config, party: int, width: int) -> PartyModel:
    """Party `party`'s networks as anyone can rebuild them when secrets follow from the public seed
    (the broken derivation the shipped build no longer uses)."""
    model = PartyModel(width, cfg.h_dim, cfg.party_hidden, cfg.options.get("variant", "I"), cfg.min_decoder_std,
                       cfg.indicator_hidden)
    return initialise(model, RoleSecret.for_tests(cfg.seed, party).stream("party/init"))


def public_seed_noise(cfg: Config, party: int) -> KeyStream:
    """The active party's stage-1 noise as anyone could regenerate it from the public seed (weak build)."""
    return RoleSecret.for_tests(cfg.seed, party).stream("active/noise/pretrain")


def public_seed_active(cfg: Config, n_classes: int) -> ActiveModel:
    model = ActiveModel(cfg.h_dim, cfg.z_dim, cfg.global_hidden, n_classes, cfg.discriminator_hidden, cfg.task)
    return initialise(model, RoleSecret.for_tests(cfg.seed, cfg.active_index).stream("active/init"))


# -- attacks -----------------------------------------------------------------------------------------


def search_mask_key(share: np.ndarray, known_mask: np.ndarray, sign: int, bits: int = 16,
                    plausible: float = 1e6) -> np.ndarray | None:
    """Brute-force the unknown pair key of a masked share over a `bits`-bit space: the candidate whose
    keystream leaves only small fixed-point values (real contributions) is the key. Returns the decoded
    input, or None when no candidate in the space fits (the key is not that small)."""
    base = share.astype(np.int64) - known_mask
    head = min(base.size, 8)  # each candidate is tried on a few values, then checked on all
    for candidate in range(2**bits):
        stream = KeyStream(weak_key(candidate.to_bytes(bits // 8, "big")))
        if np.abs((base[:head] - sign * stream.integers(head)).astype(np.float64) / 2**16).max() >= plausible:
            continue
        stream = KeyStream(weak_key(candidate.to_bytes(bits // 8, "big"))).integers(base.size)
        values = (base - sign * stream).astype(np.float64) / 2**16  # int64 arithmetic wraps: the ring
        if np.abs(values).max() < plausible:
            return values
    return None


def invert_encoders(encoders: list[PartyModel], held: torch.Tensor, target: torch.Tensor,
                    steps: int = 800) -> list[torch.Tensor]:
    """Features x_k that make the (known) encoders' summed posterior terms equal `target` (B, 2 d_h):
    gradient descent from the all-zero guess. `held` (B, len(encoders)) says which of them hold a row."""
    xs = [torch.zeros(target.shape[0], enc.n_features, requires_grad=True) for enc in encoders]
    optimizer = torch.optim.Adam(xs, lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        pred = sum(enc.posterior_contribution(x, held[:, i]) for i, (enc, x) in enumerate(zip(encoders, xs,
                                                                                              strict=True)))
        ((pred - target) ** 2).sum().backward()
        optimizer.step()
    return [x.detach() for x in xs]


def relative_error(estimate: torch.Tensor, truth: torch.Tensor, reference: torch.Tensor) -> float:
    """RMSE of `estimate` over the RMSE of guessing the feature mean (`reference` rows give the mean):
    about 1 is chance, about 0 is an exact reconstruction."""
    rmse = ((estimate - truth) ** 2).mean().sqrt()
    chance = ((truth - reference.mean(0)) ** 2).mean().sqrt()
    return float(rmse / chance)


# -- hostile payloads --------------------------------------------------------------------------------


class _Touch:
    """Unpickling this creates a file: proof that a receiver ran code it was sent."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def pickle_payload(marker: Path) -> bytes:
    """A pickle whose unpickling creates `marker`: shown armed here (unpickled once, the marker checked and
    removed), so a test's `not marker.exists()` means the receiver did not unpickle it."""
    payload = pickle.dumps(_Touch(marker))
    pickle.loads(payload)  # noqa: S301 - proves the payload is armed
    if not Path(marker).exists():
        raise AssertionError("the pickle payload does not run on unpickling")
    Path(marker).unlink()
    return payload
