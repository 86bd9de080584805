"""What one process hosts: some parties' modules and data, maybe the active party, and a transport.

In the local runtime a single `World` hosts every party and the active party; in the distributed
runtime each process hosts one party (the active party's process also hosts the label side). The
step functions in `steps.py` are written against this object only, so both runtimes run the same
code and draw the same random numbers: every role owns its generator, seeded from (seed, role).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .config import Config
from .errors import InputError
from .model import ActiveModel, PartyModel, PartyStack

ACTIVE_STREAM = 1_000_003


def role_generator(seed: int, role: int, device: torch.device) -> torch.Generator:
    """The generator of one role: party k uses role k, the active party's label side ACTIVE_STREAM."""
    generator = torch.Generator(device=device)
    generator.manual_seed(int(np.random.SeedSequence([seed, role]).generate_state(1)[0]))
    return generator


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise InputError(f"unknown device {name!r}; choose auto, cpu or cuda")
    return torch.device(name)


def build_party(cfg: Config, party: int, n_features: int, device: torch.device) -> PartyModel:
    """Party k's modules, initialised from its own seed so every runtime starts identically."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence([cfg.seed, party, 7]).generate_state(1)[0]))
        model = PartyModel(n_features, cfg.h_dim, cfg.party_hidden, cfg.variant, cfg.min_decoder_std,
                           cfg.indicator_hidden)
    return model.to(device)


def build_active(cfg: Config, n_classes: int, device: torch.device) -> ActiveModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence([cfg.seed, ACTIVE_STREAM, 7]).generate_state(1)[0]))
        model = ActiveModel(cfg.h_dim, cfg.z_dim, cfg.global_hidden, n_classes, cfg.discriminator_hidden,
                            cfg.task)
    return model.to(device)


@dataclass
class Batch:
    """One mini-batch as this process holds it: its parties' blocks and held-row masks, and at the
    active party the number of observed parties per row and the labels (stage 2)."""

    x: dict[int, Tensor]
    held: dict[int, Tensor]
    n_observed: Tensor | None = None
    y: Tensor | None = None


@dataclass
class World:
    cfg: Config
    n_parties: int
    active_party: int
    parties: dict[int, PartyModel]
    active: ActiveModel | None
    transport: object
    device: torch.device
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    party_stack: PartyStack | None = None  # the hosted parties as batched products (local runtime)

    @property
    def hosts_active(self) -> bool:
        return self.active is not None

    def party_generator(self, party: int) -> torch.Generator:
        return self.generators[party]

    @property
    def active_generator(self) -> torch.Generator:
        return self.generators[ACTIVE_STREAM]

    def posterior_contributions(self, batch: Batch) -> dict[int, Tensor]:
        """Each hosted party's posterior contribution, computed from its own block only."""
        if self.party_stack is not None:
            return self.party_stack.posterior_contributions(batch.x, batch.held)
        return {k: party.posterior_contribution(batch.x[k], batch.held[k]) for k, party in self.parties.items()}

    def likelihood_contributions(self, h: dict[int, Tensor], batch: Batch) -> dict[int, Tensor]:
        """Each hosted party's log-likelihood contribution for its copy h[k] of the latent samples."""
        if self.party_stack is not None:
            return self.party_stack.log_likelihood_contributions(h, batch.x, batch.held, self.generators)
        return {k: party.log_likelihood_contribution(h[k], batch.x[k], batch.held[k], self.party_generator(k))
                for k, party in self.parties.items()}

    def reseed(self, stream: int) -> None:
        """Reset every hosted role's generator to (seed, role, stream): used before evaluation so
        that predictions do not depend on how many training steps ran before them."""
        for role, generator in self.generators.items():
            generator.manual_seed(int(np.random.SeedSequence([self.cfg.seed, role, stream]).generate_state(1)[0]))


def make_world(cfg: Config, widths: dict[int, int], n_classes: int | None, transport: object,
               device: torch.device) -> World:
    """A world hosting the parties in `widths` (party -> block width) and, when `n_classes` is not
    None, the active party's label side."""
    parties = {k: build_party(cfg, k, d, device) for k, d in sorted(widths.items())}
    active = build_active(cfg, n_classes, device) if n_classes is not None else None
    generators = {k: role_generator(cfg.seed, k, device) for k in parties}
    if active is not None:
        generators[ACTIVE_STREAM] = role_generator(cfg.seed, ACTIVE_STREAM, device)
    batched = cfg.stack_parties == "always" or (cfg.stack_parties == "auto" and device.type == "cuda")
    stack = PartyStack(parties) if batched and PartyStack.can_stack(parties) else None
    return World(cfg, cfg.parties, cfg.active, parties, active, transport, device, generators, stack)
