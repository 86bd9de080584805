"""`federation.toml`: who the parties are, which one holds the labels, the protocol, the tables' ID and
label columns, the model's hyperparameters, where the parties meet, and each party's own files.

    [federation]
    active = "bank"                 # the party that holds the labels
    protocol = "mpc"                # plain | mpc | he
    id_column = "id"
    label_column = "label"          # in the active party's tables; empty where unlabeled
    task = "classification"         # or "regression"
    rendezvous = "10.0.0.1:29611"   # host:port where the active party listens (gRPC, mutual TLS)
    join_timeout_s = 60             # one host per party: how long the active party waits for the others
    max_ids = 1000000               # the largest ID list any party may bring to the alignment

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
    key = "ed25519:..."             # the party's pinned identity (`federation keygen` prints this line)
    identity = "bank/identity.key"  # optional: this party's own private key (default: next to its model folder)

    [aggregator]                    # he only: the non-colluding aggregator
    address = "10.0.0.9:29612"      # host:port where it listens
    key = "ed25519:..."             # its pinned identity
    identity = "aggregator/identity.key"  # optional: its own private key (on its host)

Every mistake is one `InputError` naming the file and the setting.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..config import Config, StageConfig, make_config
from ..errors import InputError
from ..secure.identity import IdentityError, parse_pin
from ..transport.protocols import PROTOCOLS

AGGREGATOR = "aggregator"
DEFAULT_MAX_IDS = 1_000_000
_SECTIONS = {"federation", "model", "party", "aggregator"}
_FEDERATION_KEYS = {"active", "protocol", "id_column", "label_column", "task", "rendezvous",
                    "allow_two_party_disclosure", "join_timeout_s", "max_ids"}
_PARTY_KEYS = {"name", "train", "predict", "model", "key", "identity"}
_AGGREGATOR_KEYS = {"address", "key", "identity"}


@dataclass(frozen=True)
class PartySpec:
    name: str
    train: Path
    predict: Path
    model_dir: Path
    key: bytes | None = None  # the pinned Ed25519 public key
    identity: Path | None = None  # this party's own private key file (used only on its own host)


@dataclass(frozen=True)
class AggregatorSpec:
    address: tuple[str, int] | None = None
    key: bytes | None = None
    identity: Path | None = None


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
    aggregator: AggregatorSpec = AggregatorSpec()
    allow_two_party_disclosure: bool = False
    join_timeout_s: float = 60.0
    max_ids: int = DEFAULT_MAX_IDS

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parties]

    def party(self, name: str) -> PartySpec:
        for spec in self.parties:
            if spec.name == name:
                return spec
        raise InputError(f"{self.path}: unknown party {name!r}; the parties are {', '.join(self.names)}")

    def pins(self, with_aggregator: bool) -> dict[str, bytes]:
        """Every participant's pinned key (the aggregator's too when the protocol has one); a missing pin is
        refused: a party talks to no one it has not pinned."""
        missing = [p.name for p in self.parties if p.key is None]
        if with_aggregator and self.aggregator.key is None:
            missing.append(AGGREGATOR)
        if missing:
            raise InputError(f"{self.path}: no key pinned for {', '.join(missing)}; each participant runs "
                             "`python -m falsevfl_secure.federation keygen --config F --party NAME` and every "
                             "file pins the printed `key = \"ed25519:...\"` line")
        pins = {p.name: p.key for p in self.parties}
        return {**pins, AGGREGATOR: self.aggregator.key} if with_aggregator else pins

    def identity_path(self, name: str) -> Path:
        """Where role `name` keeps its own private key (its `identity` setting, or the default)."""
        if name == AGGREGATOR:
            return self.aggregator.identity or self.path.parent / AGGREGATOR / "identity.key"
        spec = self.party(name)
        return spec.identity or spec.model_dir.parent / "identity.key"


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
                      _text(section, "label_column", path, "federation"), task,
                      _address(section, "rendezvous", path, "federation"),
                      _model(raw, path, len(parties), names.index(active), task), _aggregator(raw, path),
                      _disclosure(section, path), _join_timeout(section, path), _max_ids(section, path))


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


def _address(section: dict, key: str, path: Path, where: str) -> tuple[str, int]:
    text = _text(section, key, path, where)
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"{path}: [{where}] {key} = {text!r} must be HOST:PORT")
    return host, int(port)


def _max_ids(section: dict, path: Path) -> int:
    value = section.get("max_ids", DEFAULT_MAX_IDS)
    from ..secure.align import MAX_IDS

    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_IDS:
        raise InputError(f"{path}: [federation] max_ids = {value!r} must be an integer in 1..{MAX_IDS}")
    return value


def _pin(section: dict, path: Path, where: str) -> bytes | None:
    if "key" not in section:
        return None
    try:
        return parse_pin(section["key"])
    except IdentityError as error:
        raise InputError(f"{path}: [{where}] key: {error}") from None


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
    unknown = set(entry) - _PARTY_KEYS
    if unknown:
        raise InputError(f"{path}: [{where}] unknown settings {sorted(unknown)}; valid: {sorted(_PARTY_KEYS)}")
    base = path.parent
    identity = base / _text(entry, "identity", path, where) if "identity" in entry else None
    return PartySpec(_text(entry, "name", path, where), base / _text(entry, "train", path, where),
                     base / _text(entry, "predict", path, where), base / _text(entry, "model", path, where),
                     _pin(entry, path, where), identity)


def _aggregator(raw: dict, path: Path) -> AggregatorSpec:
    section = raw.get("aggregator", {})
    if not isinstance(section, dict) or set(section) - _AGGREGATOR_KEYS:
        raise InputError(f"{path}: [aggregator] takes only {sorted(_AGGREGATOR_KEYS)}")
    address = _address(section, "address", path, "aggregator") if "address" in section else None
    identity = path.parent / _text(section, "identity", path, "aggregator") if "identity" in section else None
    return AggregatorSpec(address, _pin(section, path, "aggregator"), identity)


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
