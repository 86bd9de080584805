"""A party's saved model: only its own part, and a manifest that says what it belongs to.

`MODEL_DIR/model.pt` holds the party's networks (the active party's also the global encoder and decoder
and the discriminator) and its role secret (owner-only file: predictions key their noise with it, so
two predictions of a record agree), read back with ``torch.load(weights_only=True)``. `MODEL_DIR/manifest.json`
(format `falsevfl-party-model/2`) holds:

- `party`;
- `encoding` (data/encoding.py): the party's raw feature `columns` (a prediction table may list them in
  any order), the categories of each categorical column and their training shares,
  the standardisation of the numeric columns fitted on their observed training cells, and the encoded
  column names (`encoded_columns`, e.g. `smoker=yes`) in the block's order;
- `fingerprint`, `settings`: the configuration the model was trained with; `protocol`;
- at the active party: `classes` (classification) or `target` (regression: the labeled rows' mean and
  std, `{"mean": m, "std": s}`), else null;
- `weights_sha256`: its model.pt's digest; `trained_in`: the training run's session id (hex), the same
  in every party's manifest of one run, which `predict` compares (`party._same_training`).

A manifest of format 1 (numeric columns only, no target scale) is still read.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config
from ..data.encoding import Encoding
from ..data.errors import DataError
from ..data.standardize import Standardizer
from ..data.targets import TargetScale
from ..errors import InputError
from ..fsio import atomic_write, interrupted, read_regular, write_json

if TYPE_CHECKING:
    from ..node import Node

FORMAT = "falsevfl-party-model/2"
_FORMAT_1 = "falsevfl-party-model/1"


@dataclass(frozen=True)
class Manifest:
    party: str
    encoding: Encoding
    fingerprint: str
    settings: dict
    protocol: str
    classes: tuple[str, ...] | None  # the active party's label classes (classification)
    target: TargetScale | None = None  # the active party's target scale (regression)
    weights: str | None = None  # SHA-256 of its model.pt: a folder committed half-way pairs no other weights
    trained_in: str | None = None  # the training run's session id (hex): every party's model of one run names it

    @property
    def columns(self) -> tuple[str, ...]:
        return self.encoding.columns

    def to_dict(self) -> dict:
        return {"format": FORMAT, "party": self.party,
                "encoding": {**self.encoding.to_dict(), "encoded_columns": list(self.encoding.names)},
                "fingerprint": self.fingerprint, "settings": self.settings, "protocol": self.protocol,
                "classes": None if self.classes is None else list(self.classes),
                "target": None if self.target is None else self.target.to_dict(), "weights_sha256": self.weights,
                "trained_in": self.trained_in}

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        """The inverse of `to_dict` (also format 1); KeyError, TypeError or ValueError when malformed."""
        if d.get("format") == _FORMAT_1:
            columns = tuple(d["columns"])
            encoding = Encoding(columns, {}, {}, Standardizer.from_dict(d["standardizer"]))
            target = None
        elif d.get("format") == FORMAT:
            encoding = Encoding.from_dict(d["encoding"])
            target = None if d["target"] is None else TargetScale.from_dict(d["target"])
        else:
            raise ValueError(f"unknown format {d.get('format')!r}, expected {FORMAT!r}")
        if d["classes"] is not None and not isinstance(d["classes"], list):
            raise ValueError("its classes are not a list")
        classes = None if d["classes"] is None else tuple(d["classes"])
        if not isinstance(d["settings"], dict) or not isinstance(d["party"], str) or classes is not None and (
                len(classes) < 2 or len(set(classes)) != len(classes) or not all(isinstance(c, str) for c in classes)):
            raise ValueError("its settings, party or classes are not of the form it writes")
        weights = d.get("weights_sha256")  # (absent before it was written: nothing to compare)
        if weights is not None and not (isinstance(weights, str) and len(weights) == 64):
            raise ValueError("its weights digest is not a SHA-256")
        run = d.get("trained_in")  # (absent before it was written)
        if run is not None and not (isinstance(run, str) and len(run) == 64 and _is_hex(run)):
            raise ValueError("its training run is not a session id")
        return cls(d["party"], encoding, d["fingerprint"], d["settings"], d["protocol"], classes, target, weights, run)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def save_model(model_dir: Path, node: Node, rank: int, manifest: Manifest) -> None:
    """Write this party's part of the trained model and its manifest (each file atomically)."""
    import torch  # here, not at the top: reading a manifest (`federation check`) needs no torch

    role = node.parties[rank]
    state = {"secret": role.randomness.secret.to_tensor()}
    for name, module in node.method.checkpoint_modules(node, rank).items():
        state[name] = module.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(Path(model_dir) / "model.pt", buffer.getvalue(), private=True)  # it holds the party's secret
    weights = hashlib.sha256(buffer.getvalue()).hexdigest()
    write_json(Path(model_dir) / "manifest.json", replace(manifest, weights=weights).to_dict())


def load_manifest(model_dir: Path, party: str, cfg: Config) -> Manifest:
    """The manifest of `party`'s saved model, refused when it belongs to another party or configuration, or while
    a training's move of the folder into place is unfinished (the launcher finishes it under its lock)."""
    if interrupted(model_dir):
        raise InputError(f"party {party!r}: a training's move of {model_dir} into place was interrupted; the "
                         "party's next `predict` or `train` finishes it")
    path = Path(model_dir) / "manifest.json"
    try:
        manifest = Manifest.from_dict(json.loads(read_regular(path)))
    except FileNotFoundError:
        raise InputError(f"party {party!r}: no trained model in {model_dir} (run `train` first)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, DataError, RecursionError) as error:
        raise InputError(f"party {party!r}: {path} is not a model manifest ({error})") from error
    if manifest.party != party:
        raise InputError(f"party {party!r}: {model_dir} holds the model of party {manifest.party!r}")
    if manifest.fingerprint != cfg.fingerprint():
        changed = sorted(k for k in set(manifest.settings) | set(cfg.training_settings())
                         if manifest.settings.get(k) != cfg.training_settings().get(k))
        what = f"other settings ({', '.join(changed)})" if changed else "settings whose fingerprint is not its own " \
            "(manifest.json was edited)"
        raise InputError(f"party {party!r}: the model in {model_dir} was trained with {what}; train again or "
                         "restore the federation file it was trained with")
    return manifest


def saved_weights(model_dir: Path, expected: str | None) -> bytes:
    """The bytes of the party's model.pt, refused when they are not the ones its manifest names (`expected`, their
    SHA-256; None: a manifest written before the digest was)."""
    path = Path(model_dir) / "model.pt"
    try:
        data = read_regular(path)
    except OSError as error:
        raise InputError(f"{path}: no saved model to load ({error.strerror})") from None
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise InputError(f"{path}: not the weights its manifest.json names (the folder was written half-way, or by "
                         "another run): train again")
    return data


def load_weights(model_dir: Path, node: Node, rank: int, expected: str | None = None) -> None:
    """Load this party's saved networks and role secret into `node` (tensors only: weights_only=True), refused
    when they are not the ones its manifest names (`expected`, their SHA-256: a kill while a retrain committed the
    folder file by file could pair a new manifest with old weights). A model saved before secrets were kept keeps
    the node's fresh secret (predictions then vary)."""
    import torch

    from ..randomness import RoleSecret

    path, data = Path(model_dir) / "model.pt", saved_weights(model_dir, expected)
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")  # a GPU-trained model on any host
        role = node.parties[rank]
        for name, module in node.method.checkpoint_modules(node, rank).items():
            module.load_state_dict(state[name])
        if "secret" in state:
            role.randomness.load(RoleSecret.from_tensor(state["secret"]), {})
    except Exception as error:  # a missing, foreign or corrupt file: torch raises several types here
        raise InputError(f"{path}: not this party's saved model, or one of an older build whose networks have "
                         f"other shapes (train again) ({type(error).__name__})") from error
