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

    def save(self, progress: Progress, state: dict, keep_stage1: bool = False) -> None:
        """Write one epoch's state and drop the older ones but the last KEEP (`keep_stage1`: and the last of stage
        1, where a resumed stage 2 starts again from it: a cached stage 2, whose passive parties checkpoint all
        its epochs at once, left none that every party held)."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write(self.path(progress), buffer.getvalue(), private=True)  # it holds the party's secret
        held = self.available()
        first = [p for p in held if p[0] is Stage.PRETRAIN][-1:] if keep_stage1 else []
        for older in held[:-KEEP]:
            if older not in first:
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
            state = torch.load(path, weights_only=True, map_location="cpu")  # saved on a GPU, resumed anywhere
        except Exception as error:  # a foreign or corrupt file: torch raises several types here
            raise InputError(f"{path}: not a checkpoint of this program ({type(error).__name__}: "
                             f"{(str(error).splitlines() or [''])[0]})") from error
        if not isinstance(state, dict):  # (weights_only allows a list or a tensor: review, an AttributeError)
            raise InputError(f"{path}: not a checkpoint of this program (a {type(state).__name__}, not its mapping)")
        return state


def owns(party: int, optimizer: str, active_index: int) -> bool:
    """Whether an optimiser (named by the method: "party<k>" for party k's own, any other name for the
    active party's label side) belongs to `party`."""
    if optimizer.startswith("party") and optimizer[5:].isdigit():
        return int(optimizer[5:]) == party
    return party == active_index


def party_state(node: Node, party: int, optimizers: dict) -> dict:
    """What party `party` owns in this process (the modules its method names, its secret, its streams, its
    optimisers): never another party's parameters or secret."""
    role = node.parties[party]
    state = {"fingerprint": node.cfg.fingerprint(), "settings": json.dumps(node.cfg.training_settings()),
             "secret": role.randomness.secret.to_tensor(), "streams": role.randomness.state(),
             "optimizers": {k: o.state_dict() for k, o in optimizers.items()
                            if owns(party, k, node.cfg.active_index)}}
    for name, module in node.method.checkpoint_modules(node, party).items():
        state[name] = module.state_dict()
    return state


def restore_party(node: Node, party: int, state: dict, optimizers: dict) -> None:
    """Party `party`'s state from its checkpoint, refused (one line naming what differs) when the checkpoint is of
    another configuration: review finding, a federation's --resume and --rejoin took any checkpoint whose networks
    fit (another seed, learning rate, schedule or table), where only `simulate` checked."""
    if state.get("fingerprint") != node.cfg.fingerprint():
        raise InputError(f"party {party}: its checkpoint belongs to another configuration: "
                         f"{differences(_settings(state), node.cfg)}; train again without --resume")
    if missing := sorted({"secret", "streams", "optimizers"} - set(state)):
        raise InputError(f"party {party}: its checkpoint lacks {missing}; train again without --resume")
    role = node.parties[party]
    for name, module in node.method.checkpoint_modules(node, party).items():
        try:
            module.load_state_dict(state[name])
        except (RuntimeError, KeyError) as error:  # shapes of another build (e.g. an older decoder format)
            raise InputError(f"party {party}: its checkpoint's {name} does not fit this build's networks "
                             f"({str(error).splitlines()[0]}); train again without --resume") from error
    role.randomness.load(RoleSecret.from_tensor(state["secret"]), state["streams"])
    for name, opt_state in state["optimizers"].items():
        if name in optimizers:
            optimizers[name].load_state_dict(opt_state)


def check_resumable(directory: Path | str, parties: range | list[int], cfg: Config) -> Progress:
    """Before any work: the latest epoch every party completed, from checkpoints of this configuration.

    Refuses, naming the differing settings, checkpoints of another configuration (another seed,
    method, variant, number of parties, ...), and says so when there is nothing to resume."""
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
                             f"{differences(_settings(state), cfg)}")
    return latest


def _settings(state: dict) -> dict:
    """A checkpoint's recorded training settings ({} where they do not read as a JSON object)."""
    try:
        settings = json.loads(state.get("settings", "{}"))
    except (TypeError, ValueError, RecursionError):
        return {}
    return settings if isinstance(settings, dict) else {}


def differences(saved: dict, cfg: Config) -> str:
    """The training settings that differ, as "name: saved -> now" (the method's own options by their names)."""
    def flat(settings: dict) -> dict:
        return {**{k: v for k, v in settings.items() if k != "options"}, **settings.get("options", {})}

    saved, now = flat(saved), flat(cfg.training_settings())
    changed = [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
               if saved.get(k) != now.get(k)]
    return "; ".join(changed) or "an unknown setting"
