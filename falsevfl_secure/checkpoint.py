"""Per-party checkpoints, written atomically at the end of every epoch.

Each party writes only its own file: its modules, its optimiser state, its secret and the positions of
its secret streams (the active party's file also holds its label side), plus the fingerprint and the
settings of the configuration it belongs to. Files are read with ``torch.load(weights_only=True)``: a
checkpoint holds tensors, numbers and strings, never code. The last two epochs are kept per party: the
parties of a distributed run finish an epoch at slightly different times, and a resume needs an epoch
that every party completed.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import torch

from .config import Config, Stage
from .errors import InputError
from .fsio import atomic_write
from .node import Node
from .randomness import RoleSecret

KEEP = 2
_NAME = re.compile(r"party(\d+)-stage([12])-epoch(\d+)\.pt$")
Progress = tuple[Stage, int]  # (stage, last completed epoch)


def progress_key(progress: Progress) -> int:
    """A total order on (stage, completed epoch)."""
    return int(progress[0]) * 1_000_000 + progress[1]


class Checkpointer:
    """One party's checkpoint files in `directory`."""

    def __init__(self, directory: Path | str, party: int) -> None:
        self.directory, self.party = Path(directory), party

    def path(self, progress: Progress) -> Path:
        stage, epoch = progress
        return self.directory / f"party{self.party}-stage{int(stage)}-epoch{epoch:05d}.pt"

    def save(self, progress: Progress, state: dict) -> None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write(self.path(progress), buffer.getvalue(), private=True)  # it holds the party's secret
        for older in self.available()[:-KEEP]:
            self.path(older).unlink(missing_ok=True)

    def available(self) -> list[Progress]:
        """(stage, completed epoch) of this party's checkpoints, oldest first."""
        found = []
        for path in self.directory.glob(f"party{self.party}-stage*-epoch*.pt"):
            match = _NAME.search(path.name)
            if match and int(match.group(1)) == self.party:
                found.append((Stage(int(match.group(2))), int(match.group(3))))
        return sorted(found, key=progress_key)

    def clear(self) -> None:
        """Remove this party's checkpoints of an earlier run (a fresh run replaces them)."""
        for progress in self.available():
            self.path(progress).unlink(missing_ok=True)

    def load(self, progress: Progress) -> dict:
        path = self.path(progress)
        try:
            return torch.load(path, weights_only=True)
        except Exception as error:  # a foreign or corrupt file: torch raises several types here
            raise InputError(f"{path}: not a checkpoint of this program ({type(error).__name__}: "
                             f"{(str(error).splitlines() or [''])[0]})") from error


def party_state(node: Node, party: int, optimizers: dict) -> dict:
    """What party `party` owns in this process: never another party's parameters or secret."""
    role = node.parties[party]
    state = {"fingerprint": node.cfg.fingerprint(), "settings": json.dumps(node.cfg.training_settings()),
             "party_module": role.model.state_dict(), "secret": role.randomness.secret.to_tensor(),
             "streams": role.randomness.state(),
             "optimizers": {k: o.state_dict() for k, o in optimizers.items() if k == f"party{party}"}}
    if party == node.cfg.active_index and node.active.present:
        state["active_module"] = node.active.get().model.state_dict()
        state["optimizers"].update({k: o.state_dict() for k, o in optimizers.items()
                                    if k in ("active", "discriminator")})
    return state


def restore_party(node: Node, party: int, state: dict, optimizers: dict) -> None:
    role = node.parties[party]
    role.model.load_state_dict(state["party_module"])
    role.randomness.load(RoleSecret.from_tensor(state["secret"]), state["streams"])
    if "active_module" in state:
        node.active.get().model.load_state_dict(state["active_module"])
    for name, opt_state in state["optimizers"].items():
        if name in optimizers:
            optimizers[name].load_state_dict(opt_state)


def check_resumable(directory: Path | str, parties: range | list[int], cfg: Config) -> Progress:
    """Before any work: the latest epoch every party completed, from checkpoints of this configuration.

    Refuses, naming the differing settings, checkpoints of another configuration (another seed,
    variant, number of parties, ...), and says so when there is nothing to resume."""
    checkpointers = [Checkpointer(directory, k) for k in parties]
    common = set.intersection(*(set(c.available()) for c in checkpointers))
    if not common:
        raise InputError(f"--resume: no checkpoint that every party completed in {directory}; "
                         "nothing to resume (start without --resume)")
    latest = max(common, key=progress_key)
    for c in checkpointers:
        state = c.load(latest)
        if state.get("fingerprint") != cfg.fingerprint():
            raise InputError(f"--resume: {c.path(latest)} belongs to another configuration: "
                             f"{differences(json.loads(state.get('settings', '{}')), cfg)}")
    return latest


def differences(saved: dict, cfg: Config) -> str:
    """The training settings that differ, as "name: saved -> now"."""
    now = cfg.training_settings()
    changed = [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
               if saved.get(k) != now.get(k)]
    return "; ".join(changed) or "an unknown setting"
