"""What one process hosts: some parties, maybe the active party's label side, and a transport.

In the local runtime a single `Node` hosts every party and the active party; in the distributed runtime
each process hosts one party (the active party's process also hosts the label side). The step functions
in `steps.py` are written against this object only, so every runtime runs the same code. Each party
draws its initial weights and its noise from its own secret streams (`randomness`): nothing here
follows from the public seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from .config import Config, Stage
from .errors import InputError
from .model import ActiveModel, PartyModel, PartyStack, initialise
from .model.party import Noise
from .placement import Active
from .randomness import RecordNoise, RoleRandomness, RoleSecret, SharedNoise
from .transport.base import Transport


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise InputError(f"unknown device {name!r}; choose auto, cpu or cuda")
    return torch.device(name)


@dataclass
class PartyRole:
    """One party: its networks and its secret randomness."""

    index: int
    model: PartyModel
    randomness: RoleRandomness

    def noise(self, stage: Stage, repeatable: bool = False) -> Noise:
        """This party's noise stream for `stage`; a repeatable prediction draws one secret (S, 1, d_k)
        block afresh for every batch and shares it by all rows (`SharedNoise`): nothing depends on the
        batch, and nothing new is needed from another party."""
        if repeatable and stage is Stage.PREDICT:
            return SharedNoise(self.randomness.secret.stream("party/noise/predict/shared"))
        return self.randomness.stream(f"party/noise/{stage.key}")


@dataclass
class ActiveRole:
    """The active party's label side: the global encoder and decoder, the discriminator, its randomness."""

    model: ActiveModel
    randomness: RoleRandomness

    def noise(self, stage: Stage, record_keys: np.ndarray | None = None) -> Noise:
        """The active party's noise for `stage`; a prediction with record keys draws each row's latent
        and z noise from that row's own stream (`RecordNoise`: the secret and the row's key only)."""
        if record_keys is not None and stage is Stage.PREDICT:
            return RecordNoise(self.randomness.secret, "active/noise", record_keys)
        return self.randomness.stream(f"active/noise/{stage.key}")


@dataclass
class Batch:
    """One mini-batch as this process holds it: its parties' blocks and held-row masks, and at the
    active party the number of observed parties per row and the labels; the observed-cell masks of
    the parties that have empty cells, and the rows' record keys (repeatable predictions) or None."""

    x: dict[int, Tensor]
    held: dict[int, Tensor]
    n_observed: Active[Tensor]
    y: Active[Tensor]
    observed: dict[int, Tensor] = field(default_factory=dict)
    record_keys: np.ndarray | None = None

    @property
    def size(self) -> int:
        return next(iter(self.held.values())).shape[0]


@dataclass
class Node:
    cfg: Config
    parties: dict[int, PartyRole]
    active: Active[ActiveRole]
    transport: Transport
    device: torch.device
    stack: PartyStack | None = None  # the hosted parties as batched products (local runtime, CUDA)

    def cells(self, batch: Batch) -> dict[int, Tensor]:
        """The observed-cell masks the party models see: the batch's under cell_handling "mask"; none
        under "mean", where the empty cells are the mean-imputed values of the data and count as observed."""
        return batch.observed if self.cfg.cell_handling == "mask" else {}

    def posterior_contributions(self, batch: Batch) -> dict[int, Tensor]:
        """Each hosted party's posterior contribution, computed from its own block only."""
        cells = self.cells(batch)
        if self.stack is not None:
            return self.stack.posterior_contributions(batch.x, batch.held, cells)
        return {k: role.model.posterior_contribution(batch.x[k], batch.held[k], cells.get(k))
                for k, role in self.parties.items()}

    def likelihood_contributions(self, h: Mapping[int, Tensor], batch: Batch, stage: Stage) -> dict[int, Tensor]:
        """Each hosted party's log-likelihood contribution for its copy h[k] of the latent samples."""
        noise = {k: role.noise(stage, batch.record_keys is not None) for k, role in self.parties.items()}
        cells = self.cells(batch)
        if self.stack is not None:
            return self.stack.log_likelihood_contributions(h, batch.x, batch.held, noise, cells)
        return {k: role.model.log_likelihood_contribution(h[k], batch.x[k], batch.held[k], noise[k], cells.get(k))
                for k, role in self.parties.items()}

    def modules(self) -> list[nn.Module]:
        label_side = [self.active.get().model] if self.active.present else []
        return [*(role.model for role in self.parties.values()), *label_side]

    def randomness(self) -> list[RoleRandomness]:
        return [role.randomness for role in self.parties.values()]

    def restart_noise(self, stage: Stage) -> None:
        """Restart every hosted role's noise for `stage` (evaluation: the same draws however long training ran)."""
        for rand in self.randomness():
            rand.restart(f"party/noise/{stage.key}")
            rand.restart(f"active/noise/{stage.key}")


def build_node(cfg: Config, widths: Mapping[int, int], n_classes: int | None, transport: Transport,
               device: torch.device, secrets: Mapping[int, RoleSecret] | None = None) -> Node:
    """A node hosting the parties in `widths` (party -> block width) and, when `n_classes` is given, the
    active party's label side. `secrets` (party -> RoleSecret) is for tests and resumed runs; a party
    without one draws a fresh secret from the operating system."""
    secrets = secrets or {}
    randomness = {k: RoleRandomness(secrets.get(k) or RoleSecret.fresh()) for k in widths}
    parties = {k: PartyRole(k, _party_model(cfg, d, randomness[k]).to(device), randomness[k])
               for k, d in sorted(widths.items())}
    active: Active[ActiveRole] = Active.absent()
    if n_classes is not None:
        rand = randomness[cfg.active_index]
        model = ActiveModel(cfg.h_dim, cfg.z_dim, cfg.global_hidden, n_classes, cfg.discriminator_hidden, cfg.task)
        active = Active(ActiveRole(initialise(model, rand.stream("active/init")).to(device), rand))
    batched = cfg.stack_parties == "always" or (cfg.stack_parties == "auto" and device.type == "cuda")
    models = {k: role.model for k, role in parties.items()}
    stack = PartyStack(models) if batched and PartyStack.can_stack(models) else None
    return Node(cfg, parties, active, transport, device, stack)


def _party_model(cfg: Config, width: int, randomness: RoleRandomness) -> PartyModel:
    model = PartyModel(width, cfg.h_dim, cfg.party_hidden, cfg.variant, cfg.min_decoder_std, cfg.indicator_hidden,
                       cell_mask=cfg.cell_handling == "mask")
    return initialise(model, randomness.stream("party/init"))
