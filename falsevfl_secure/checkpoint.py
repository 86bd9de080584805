"""Per-party checkpoints, written atomically at the end of every epoch.

Each party writes only its own file: its modules, its optimiser state and its generator state (the
active party's file also holds its label side). A file is written to a temporary name and renamed,
so a killed run never leaves a half-written checkpoint. The last two epochs are kept per party: the
parties of a distributed run finish an epoch at slightly different times, and a resume needs an
epoch that every party completed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

KEEP = 2
_NAME = re.compile(r"party(\d+)-stage([12])-epoch(\d+)\.pt$")


def progress_key(stage: int, epoch: int) -> int:
    """A total order on (stage, completed epoch)."""
    return stage * 1_000_000 + epoch


class Checkpointer:
    def __init__(self, directory: Path, party: int) -> None:
        self.directory = Path(directory)
        self.party = party
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, stage: int, epoch: int) -> Path:
        return self.directory / f"party{self.party}-stage{stage}-epoch{epoch:05d}.pt"

    def save(self, stage: int, epoch: int, state: dict) -> None:
        target = self.path(stage, epoch)
        tmp = target.with_suffix(".pt.tmp")
        torch.save({"stage": stage, "epoch": epoch, **state}, tmp)
        os.replace(tmp, target)
        for key in self.available()[:-KEEP]:
            self.path(*key).unlink(missing_ok=True)

    def available(self) -> list[tuple[int, int]]:
        """(stage, completed epoch) of this party's checkpoints, oldest first."""
        found = []
        for path in self.directory.glob(f"party{self.party}-stage*-epoch*.pt"):
            match = _NAME.search(path.name)
            if match and int(match.group(1)) == self.party:
                found.append((int(match.group(2)), int(match.group(3))))
        return sorted(found, key=lambda k: progress_key(*k))

    def load(self, stage: int, epoch: int) -> dict:
        return torch.load(self.path(stage, epoch), weights_only=False)


def party_state(world, party: int, optimizers: dict) -> dict:
    """What party `party` owns in this process: never another party's parameters."""
    state = {"party_module": world.parties[party].state_dict(),
             "generator": world.generators[party].get_state(),
             "optimizers": {k: o.state_dict() for k, o in optimizers.items() if k == f"party{party}"}}
    if party == world.active_party and world.active is not None:
        from .world import ACTIVE_STREAM

        state["active_module"] = world.active.state_dict()
        state["active_generator"] = world.generators[ACTIVE_STREAM].get_state()
        state["optimizers"].update({k: o.state_dict() for k, o in optimizers.items()
                                    if k in ("active", "discriminator")})
    return state


def restore_party(world, party: int, state: dict, optimizers: dict) -> None:
    world.parties[party].load_state_dict(state["party_module"])
    world.generators[party].set_state(state["generator"])
    if "active_module" in state:
        from .world import ACTIVE_STREAM

        world.active.load_state_dict(state["active_module"])
        world.generators[ACTIVE_STREAM].set_state(state["active_generator"])
    for name, opt_state in state["optimizers"].items():
        if name in optimizers:
            optimizers[name].load_state_dict(opt_state)
