"""A party's saved model: only its own part, and a manifest that says what it belongs to.

`MODEL_DIR/model.pt` holds the party's networks (the active party's also the global encoder and decoder
and the discriminator), read back with ``torch.load(weights_only=True)``. `MODEL_DIR/manifest.json` holds
the feature columns in order, the standardisation fitted on the party's own training rows, the
fingerprint and settings of the configuration, the protocol it was trained under and, at the active
party, the classes. A prediction table whose columns differ from the manifest's is refused, naming them.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import Config
from ..data.standardize import Standardizer
from ..errors import InputError
from ..fsio import atomic_write, write_json
from ..node import Node

FORMAT = "falsevfl-party-model/1"


@dataclass(frozen=True)
class Manifest:
    party: str
    columns: tuple[str, ...]
    standardizer: Standardizer
    fingerprint: str
    settings: dict
    protocol: str
    classes: tuple[str, ...] | None  # the active party's label classes (classification)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "party": self.party, "columns": list(self.columns),
                "standardizer": self.standardizer.to_dict(), "fingerprint": self.fingerprint,
                "settings": self.settings, "protocol": self.protocol,
                "classes": None if self.classes is None else list(self.classes)}


def save_model(model_dir: Path, node: Node, rank: int, manifest: Manifest) -> None:
    """Write this party's part of the trained model and its manifest (each file atomically)."""
    state = {"party_module": node.parties[rank].model.state_dict()}
    if node.active.present:
        state["active_module"] = node.active.get().model.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(Path(model_dir) / "model.pt", buffer.getvalue())
    write_json(Path(model_dir) / "manifest.json", manifest.to_dict())


def load_manifest(model_dir: Path, party: str, cfg: Config) -> Manifest:
    """The manifest of `party`'s saved model, refused when it belongs to another party or configuration."""
    path = Path(model_dir) / "manifest.json"
    try:
        d = json.loads(path.read_text())
        manifest = Manifest(d["party"], tuple(d["columns"]), Standardizer.from_dict(d["standardizer"]),
                            d["fingerprint"], d["settings"], d["protocol"],
                            None if d["classes"] is None else tuple(d["classes"]))
    except FileNotFoundError:
        raise InputError(f"party {party!r}: no trained model in {model_dir} (run `train` first)") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"party {party!r}: {path} is not a model manifest ({error})") from error
    if manifest.party != party:
        raise InputError(f"party {party!r}: {model_dir} holds the model of party {manifest.party!r}")
    if manifest.fingerprint != cfg.fingerprint():
        changed = sorted(k for k in set(manifest.settings) | set(cfg.training_settings())
                         if manifest.settings.get(k) != cfg.training_settings().get(k))
        raise InputError(f"party {party!r}: the model in {model_dir} was trained with other settings ({changed}); "
                         "train again or restore the federation file it was trained with")
    return manifest


def load_weights(model_dir: Path, node: Node, rank: int) -> None:
    """Load this party's saved networks into `node` (tensors only: weights_only=True)."""
    path = Path(model_dir) / "model.pt"
    try:
        state = torch.load(path, weights_only=True)
        node.parties[rank].model.load_state_dict(state["party_module"])
        if node.active.present:
            node.active.get().model.load_state_dict(state["active_module"])
    except Exception as error:  # a missing, foreign or corrupt file: torch raises several types here
        raise InputError(f"{path}: not this party's saved model ({type(error).__name__})") from error
