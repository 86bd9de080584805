"""`federation.toml`: who the parties are, which one holds the labels, the protocol, the tables' ID and
label columns, the model's hyperparameters, where the parties meet, and each party's own files.

    [federation]
    active = "bank"                 # the party that holds the labels
    protocol = "mpc"                # plain | mpc | he
    id_column = "id"
    label_column = "label"          # in the active party's tables; empty where unlabeled
    task = "classification"         # or "regression"
    rendezvous = "10.0.0.1:29611"   # host:port where the active party serves the rendezvous store
    join_timeout_s = 60             # one host per party: how long the active party waits for the others

    [model]                         # a preset ("digits", "isolet:quick", ...) and/or explicit settings
    preset = "digits"
    kappa = 10
    [model.pretrain]
    epochs = 60

    [[party]]                       # one per party, in rank order
    name = "bank"
    train = "bank/train.csv"        # paths are relative to this file
    predict = "bank/predict.csv"
    model = "bank/model"
    interface = "eth0"              # optional: the network interface gloo uses on this party's host

    [aggregator]                    # he only: the non-colluding aggregator's host
    interface = "eth0"

Every mistake is one `InputError` naming the file and the setting.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..config import Config, StageConfig, make_config
from ..errors import InputError
from ..transport.protocols import PROTOCOLS

AGGREGATOR = "aggregator"
_SECTIONS = {"federation", "model", "party", "aggregator"}
_FEDERATION_KEYS = {"active", "protocol", "id_column", "label_column", "task", "rendezvous",
                    "allow_two_party_disclosure", "join_timeout_s"}


@dataclass(frozen=True)
class PartySpec:
    name: str
    train: Path
    predict: Path
    model_dir: Path
    interface: str | None = None


@dataclass(frozen=True)
class Federation:
    path: Path
    parties: tuple[PartySpec, ...]
    active: str
    protocol: str
    id_column: str
    label_column: str
    task: str
    rendezvous: tuple[str, int]
    model: Config
    aggregator_interface: str | None = None
    allow_two_party_disclosure: bool = False
    join_timeout_s: float = 60.0

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parties]

    def party(self, name: str) -> PartySpec:
        for spec in self.parties:
            if spec.name == name:
                return spec
        raise InputError(f"{self.path}: unknown party {name!r}; the parties are {', '.join(self.names)}")


def load_federation(path: Path | str) -> Federation:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such federation file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise InputError(f"{path}: not a readable TOML file ({error})") from error
    unknown = set(raw) - _SECTIONS
    if unknown:
        raise InputError(f"{path}: unknown sections {sorted(unknown)}; expected {sorted(_SECTIONS)}")
    section = _table(raw, "federation", path)
    parties = _parties(raw, path)
    names = [p.name for p in parties]
    active = _text(section, "active", path, "federation")
    if active not in names:
        raise InputError(f"{path}: [federation] active = {active!r} is not one of the parties {names}")
    task = _task(section, path)
    return Federation(path, parties, active, _protocol(section, path), _text(section, "id_column", path, "federation"),
                      _text(section, "label_column", path, "federation"), task, _rendezvous(section, path),
                      _model(raw, path, len(parties), names.index(active), task), _aggregator(raw, path),
                      _disclosure(section, path), _join_timeout(section, path))


def _table(raw: dict, key: str, path: Path) -> dict:
    if not isinstance(raw.get(key), dict):
        raise InputError(f"{path}: missing section [{key}]")
    if key == "federation" and set(raw[key]) - _FEDERATION_KEYS:
        raise InputError(f"{path}: unknown [federation] settings {sorted(set(raw[key]) - _FEDERATION_KEYS)}")
    return raw[key]


def _text(section: dict, key: str, path: Path, where: str) -> str:
    value = section.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{path}: [{where}] {key} must be a non-empty string, got {value!r}")
    return value.strip()


def _protocol(section: dict, path: Path) -> str:
    protocol = _text(section, "protocol", path, "federation")
    if protocol not in PROTOCOLS:
        raise InputError(f"{path}: [federation] protocol = {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    return protocol


def _task(section: dict, path: Path) -> str:
    task = section.get("task", "classification")
    if task not in ("classification", "regression"):
        raise InputError(f"{path}: [federation] task = {task!r}; choose classification or regression")
    return task


def _disclosure(section: dict, path: Path) -> bool:
    value = section.get("allow_two_party_disclosure", False)
    if not isinstance(value, bool):
        raise InputError(f"{path}: [federation] allow_two_party_disclosure = {value!r} must be true or false")
    return value


def _join_timeout(section: dict, path: Path) -> float:
    value = section.get("join_timeout_s", 60.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise InputError(f"{path}: [federation] join_timeout_s = {value!r} must be a number of seconds in (0, 86400]")
    return float(value)


def _rendezvous(section: dict, path: Path) -> tuple[str, int]:
    text = _text(section, "rendezvous", path, "federation")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"{path}: [federation] rendezvous = {text!r} must be HOST:PORT")
    return host, int(port)


def _parties(raw: dict, path: Path) -> tuple[PartySpec, ...]:
    entries = raw.get("party")
    if not isinstance(entries, list) or len(entries) < 2:
        raise InputError(f"{path}: a federation needs at least two [[party]] tables")
    parties = tuple(_party(entry, i, path) for i, entry in enumerate(entries))
    names = [p.name for p in parties]
    if len(set(names)) != len(names) or AGGREGATOR in names:
        raise InputError(f"{path}: party names must be unique and not {AGGREGATOR!r}; got {names}")
    return parties


def _party(entry: dict, index: int, path: Path) -> PartySpec:
    where = f"party #{index + 1}"
    unknown = set(entry) - {"name", "train", "predict", "model", "interface"}
    if unknown:
        raise InputError(f"{path}: [{where}] unknown settings {sorted(unknown)}")
    base = path.parent
    return PartySpec(_text(entry, "name", path, where), base / _text(entry, "train", path, where),
                     base / _text(entry, "predict", path, where), base / _text(entry, "model", path, where),
                     entry.get("interface"))


def _aggregator(raw: dict, path: Path) -> str | None:
    section = raw.get("aggregator", {})
    if not isinstance(section, dict) or set(section) - {"interface"}:
        raise InputError(f"{path}: [aggregator] takes only `interface`")
    return section.get("interface")


def _model(raw: dict, path: Path, parties: int, active: int, task: str) -> Config:
    """The preset (dataset[:schedule], default schedule "default") with explicit settings on top."""
    section = dict(raw.get("model", {}))
    dataset, _, schedule = str(section.pop("preset", "digits")).partition(":")
    allowed = {f.name for f in fields(Config)} - {"parties", "active_party", "task", "dataset", "device"}
    unknown = set(section) - allowed
    if unknown:
        raise InputError(f"{path}: [model] unknown settings {sorted(unknown)}")
    try:
        cfg = make_config(dataset, schedule or "default")
        stages = {k: StageConfig(**{**getattr(cfg, k).__dict__, **section.pop(k)}) for k in ("pretrain", "train")
                  if isinstance(section.get(k), dict)}
        return replace(cfg, **section, **stages, parties=parties, active_party=active, task=task).validate()
    except (TypeError, ValueError) as error:
        raise InputError(f"{path}: [model] {error}") from error
