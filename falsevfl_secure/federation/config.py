"""`federation.toml`: who the parties are, which one holds the labels, the protocol, how the tables are
read (ID and label columns, missing cells, ID normalisation), the checks after alignment, the model's
hyperparameters, where the parties meet, and each party's own files.

Every key, its type, default and an example: docs/federation-toml.md. In short:

    [federation]
    active = "bank"                 # the party that holds the labels
    protocol = "mpc"                # plain | mpc | he
    id_column = "id"
    label_column = "label"          # in the active party's tables; empty where unlabeled
    task = "classification"         # or "regression"
    rendezvous = "10.0.0.1:29611"   # host:port where the active party listens (gRPC, mutual TLS)
    max_ids = 1000000               # the largest ID list any party may bring to the alignment

    [model]
    preset = "quick"                # quick | default | paper | <dataset>[:<schedule>]

    [[party]]                       # one per party, in rank order
    name = "bank"
    key = "ed25519:..."             # the party's pinned identity (`federation keygen` prints this line)
    train = "bank/train.csv"        # this party's own files (relative to this file): only the party that
    predict = "bank/predict.csv"    # runs with this file needs them; another party's entry is its name
    model = "bank/model"            # and key

    [aggregator]                    # he only: the non-colluding aggregator
    address = "10.0.0.9:29612"      # host:port where it listens
    key = "ed25519:..."             # its pinned identity

Every mistake is one `InputError` naming the file and the setting; an unknown key is refused with the
valid keys of its section and the closest one, and two participants pinned with one key are refused.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ..config import MULTIPLIER_RANGE, PRESETS, Config, PrivacyConfig, StageConfig, real_number
from ..data.errors import DataError
from ..data.ids import IdRule
from ..data.tables import DEFAULT_MISSING, ReadOptions
from ..errors import InputError, did_you_mean
from ..fsio import file_in_the_way, read_regular
from ..methods import METHODS, SETTINGS, make_config, method_for, method_labels, parse_method
from ..runtime.cast import AGGREGATOR
from ..secure.identity import IdentityError, parse_pin
from ..transport.protocols import PROTOCOLS

SECTIONS = ("federation", "model", "privacy", "party", "aggregator")
FEDERATION_KEYS = ("active", "protocol", "id_column", "label_column", "task", "rendezvous",
                   "allow_two_party_disclosure", "join_timeout_s", "missing_values", "id_fold_case",
                   "id_strip_leading_zeros", "id_pattern", "min_overlap", "validation_fraction", "max_ids",
                   "allow_partial_predict", "on_party_loss", "min_parties", "round_deadline_s", "validation_group")
PARTY_KEYS = ("name", "train", "predict", "model", "key", "identity", "categorical")
AGGREGATOR_KEYS = ("address", "key", "identity")
DEFAULT_MAX_IDS = 1_000_000
STAGE_KEYS = tuple(f.name for f in fields(StageConfig))
# Not model settings of a federation: fixed by the file ([[party]] order, active, task), or used by `simulate`
# only to draw its splits (train_mechanism, mechanism_rows, n_labeled, n_aligned, max_rows, standardize, cell_missing).
# `device` is one: each party's own choice for its own host (not part of the model's fingerprint).
NOT_MODEL_KEYS = {"parties", "active_party", "task", "dataset", "train_mechanism", "mechanism_rows", "n_labeled",
                   "n_aligned", "max_rows", "standardize", "cell_missing", "privacy"}
PRIVACY_KEYS = tuple(f.name for f in fields(PrivacyConfig))
MAX_DELTA = 1e-2  # a [privacy] delta past it is refused: the guarantee would fail outright too often
# Config's settings and every registered method's own options (a method refuses another's by name)
MODEL_KEYS = ("preset", *sorted(({f.name for f in fields(Config)} - NOT_MODEL_KEYS - {"options"})
                                | {name for method in METHODS.values() for name in method.options}))
# A bare schedule: the sizes tuned on digits; "auto" sizes the schedule by the table (config.sized_schedule)
SCHEDULES = ("auto", "quick", "default", "paper")
DEFAULT_PRESET = "auto"
SCHEDULE_WIDTHS = "digits"  # the dataset whose widths a bare schedule takes


OWN_PATHS = ("train", "predict", "model")  # what only the party that runs with the file must name
KEYS_FOLDER = "keys"  # the default home of every role's key: keys/<name>.key beside the file


@dataclass(frozen=True)
class PartySpec:
    name: str
    train: Path | None = None  # None: another host's party (its entry names it and pins its key only)
    predict: Path | None = None
    model_dir: Path | None = None
    key: bytes | None = None  # the pinned Ed25519 public key
    identity: Path | None = None  # this party's own private key file (used only on its own host)
    categorical: tuple[str, ...] = ()

    @property
    def missing_paths(self) -> list[str]:
        """Which of its own paths the entry does not name."""
        given = {"train": self.train, "predict": self.predict, "model": self.model_dir}
        return [key for key in OWN_PATHS if given[key] is None]


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
    missing_values: tuple[str, ...] = DEFAULT_MISSING
    id_rule: IdRule = field(default_factory=IdRule)
    min_overlap: float = 0.01
    validation_fraction: float = 0.1
    max_ids: int = DEFAULT_MAX_IDS
    allow_partial_predict: bool = False  # predict although a listed party did not join (without --absent)
    on_party_loss: str = "stop"  # "continue": training goes on without a passive party that leaves (FALSE-VFL)
    min_parties: int = 2  # ... while at least this many parties are left
    round_deadline_s: float = 45.0  # a party that heartbeats but delivers nothing this long (at least) is named
    validation_group: tuple[str, ...] = ()  # active party's columns: validation holds out whole groups of records
    preset: str = DEFAULT_PRESET  # as the file wrote it (what a handshake names: the model holds its dataset)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parties]

    def party(self, name: str) -> PartySpec:
        for spec in self.parties:
            if spec.name == name:
                return spec
        raise InputError(f"{self.path}: unknown party {name!r}; the parties are {', '.join(self.names)}")

    def own(self, name: str) -> PartySpec:
        """Party `name` as the party that runs with this file: its entry must name its own files."""
        spec = self.party(name)
        if spec.missing_paths:
            raise InputError(f"{self.path}: [[party]] name = {name!r} has no {', '.join(spec.missing_paths)}: the "
                             "file of the party that runs names its own tables and model folder there (relative to "
                             "the file; another party's entry needs only name and key)")
        return spec

    @property
    def local(self) -> list[str]:
        """The parties whose own files this file names (every party in a one-operator file, one per host); an
        entry naming only some is among them, so that `own` names what it lacks."""
        return [p.name for p in self.parties if len(p.missing_paths) < len(OWN_PATHS)]

    def present(self, absent: list[str]) -> list[str]:
        """The listed parties not declared absent; the active party is never absent."""
        unknown = [name for name in absent if name not in self.names]
        if unknown:
            raise InputError(f"--absent {unknown}: no such party; the parties are {', '.join(self.names)}")
        if self.active in absent:
            raise InputError(f"the active party {self.active!r} must be present: it holds the model's label side")
        return [name for name in self.names if name not in absent]

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
        """Where role `name` keeps its own private key: its `identity` setting, else keys/<name>.key beside
        this file (one file per name, so two roles' keygens never meet), else where an older version put
        it when a key is there (<folder of model>/identity.key, aggregator/identity.key)."""
        given = self.aggregator.identity if name == AGGREGATOR else self.party(name).identity
        if given is not None:
            return given
        default = self.path.parent / KEYS_FOLDER / f"{name}.key"
        if name == AGGREGATOR:
            older = self.path.parent / AGGREGATOR / "identity.key"
        else:
            model = self.party(name).model_dir
            older = model.parent / "identity.key" if model is not None else None
        if older is not None and older.exists() and not default.exists():
            return older  # a key made before the keys/ folder: files written then keep working
        return default

    def pinned(self) -> dict[str, bytes]:
        """The roles this file pins a key for (the aggregator too where pinned)."""
        pins = {p.name: p.key for p in self.parties if p.key is not None}
        return {**pins, AGGREGATOR: self.aggregator.key} if self.aggregator.key is not None else pins

    def read_options(self, name: str, detect_categories: bool = True,
                     categorical: tuple[str, ...] | None = None) -> ReadOptions:
        """How party `name` reads its tables (a prediction table: the saved model's categorical columns)."""
        listed = self.party(name).categorical if categorical is None else categorical
        return ReadOptions(self.missing_values, listed, detect_categories, self.id_rule)


MAX_VALIDATION_FRACTION = 0.5  # at most half the labeled records held out


def load_federation(path: Path | str) -> Federation:
    path = Path(path)
    try:
        raw = tomllib.loads(_toml_text(path))  # a BOM (a Windows editor's) is no TOML error
    except FileNotFoundError:
        raise InputError(f"{path}: no such federation file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise InputError(f"{path}: not a readable TOML file ({error}){_array_hint(path)}") from error
    refuse_unknown(raw, SECTIONS, path, "the file", "section")
    section = _table(raw, "federation", path)
    refuse_unknown(section, FEDERATION_KEYS, path, "[federation]")
    parties = _parties(raw, path)
    names = [p.name for p in parties]
    active = _text(section, "active", path, "federation")
    if active not in names:
        raise InputError(f"{path}: [federation] active = {active!r} is not one of the parties {names}"
                         f"{did_you_mean(active, names)}")
    task, aggregator = _task(section, path), _aggregator(raw, path)
    _distinct_pins(parties, aggregator, path)
    return Federation(path, parties, active, _protocol(section, path), _text(section, "id_column", path, "federation"),
                      _text(section, "label_column", path, "federation"), task,
                      _address(section, "rendezvous", path, "federation"),
                      _model(raw, path, len(parties), names.index(active), task), aggregator,
                      _flag(section, "allow_two_party_disclosure", path), _join_timeout(section, path),
                      _missing_values(section, path), _id_rule(section, path),
                      _fraction(section, "min_overlap", 0.01, 1.0, path),
                      _fraction(section, "validation_fraction", 0.1, MAX_VALIDATION_FRACTION, path),
                      _max_ids(section, path, len(parties)),
                      _flag(section, "allow_partial_predict", path), *_loss_policy(section, path, len(parties)),
                      _seconds(section, "round_deadline_s", 45.0, path), _validation_group(section, path),
                      str(raw.get("model", {}).get("preset", DEFAULT_PRESET)))


def refuse_unknown(given: Iterable[str], valid: Iterable[str], path: Path, where: str, what: str = "setting") -> None:
    """An InputError naming every unknown key, the closest valid one (`did_you_mean`) and all the valid ones."""
    valid = sorted(valid)
    unknown = sorted(set(given) - set(valid))
    if not unknown:
        return
    named = []
    for key in unknown:
        home = _home_of(key, where) if what == "setting" else ""
        named.append(f"{key!r}" + (home or did_you_mean(key, valid)))
    plural = "s" if len(unknown) > 1 else ""
    raise InputError(f"{path}: {where}: unknown {what}{plural} {', '.join(named)}; the valid {what}s are "
                     f"{', '.join(valid)} (see docs/federation-toml.md)")


def _toml_text(path: Path) -> str:
    """The file's text: a BOM (a Windows editor's) dropped, CRLF and lone CR line ends read as newlines (as
    `Path.read_text` did before the file was read as a regular file's bytes: a review found CR-only refused)."""
    return read_regular(path).decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")


def _array_hint(path: Path) -> str:
    """Where the file writes [party] for [[party]] (a bad-input sweep: TOML's own words did not say so)."""
    try:
        text = _toml_text(path)
    except (OSError, UnicodeDecodeError):
        return ""
    return "; each party is a [[party]] table (double brackets), not [party]" if re.search(
        r"(?m)^\s*\[\s*party\s*\]", text) else ""


def _home_of(key: str, where: str) -> str:
    """Where a key another section has belongs (a bad-input sweep: `class_weight` under [federation])."""
    homes = {"[federation]": FEDERATION_KEYS, "[model]": MODEL_KEYS, "[privacy]": PRIVACY_KEYS,
             "[[party]]": PARTY_KEYS, "[aggregator]": AGGREGATOR_KEYS}
    found = [name for name, keys in homes.items() if key in keys and not where.startswith(name)]
    return f" (a setting of {' and '.join(found)}, not of {where})" if found else ""


def _table(raw: dict, key: str, path: Path) -> dict:
    if not isinstance(raw.get(key), dict):
        raise InputError(f"{path}: missing section [{key}]")
    return raw[key]


def _text(section: dict, key: str, path: Path, where: str) -> str:
    value = section.get(key)
    if key not in section:  # (a trial read "must be a non-empty string, got None" for a key left out)
        raise InputError(f"{path}: [{where}] has no {key} (a non-empty string, required; docs/federation-toml.md)")
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


def _flag(section: dict, key: str, path: Path, where: str = "federation") -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise InputError(f"{path}: [{where}] {key} = {value!r} must be true or false")
    return value


def _loss_policy(section: dict, path: Path, parties: int) -> tuple[str, int]:
    """`on_party_loss` ("stop" | "continue") and `min_parties` (2..the number of parties)."""
    policy, least = section.get("on_party_loss", "stop"), section.get("min_parties", 2)
    if policy not in ("stop", "continue"):
        raise InputError(f"{path}: [federation] on_party_loss = {policy!r} must be \"stop\" or \"continue\"")
    if isinstance(least, bool) or not isinstance(least, int) or not 2 <= least <= parties:
        raise InputError(f"{path}: [federation] min_parties = {least!r} must be an integer in 2..{parties}")
    return policy, least


def _seconds(section: dict, key: str, default: float, path: Path) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 86400:
        raise InputError(f"{path}: [federation] {key} = {value!r} must be a number of seconds in [1, 86400]")
    return float(value)


def _join_timeout(section: dict, path: Path) -> float:
    value = section.get("join_timeout_s", 60.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise InputError(f"{path}: [federation] join_timeout_s = {value!r} must be a number of seconds in (0, 86400]")
    return float(value)


def _fraction(section: dict, key: str, default: float, most: float, path: Path) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                               and 0 <= value <= most):
        raise InputError(f"{path}: [federation] {key} = {value!r} must be a number in [0, {most:g}] "
                         f"(a fraction, e.g. {default:g})")
    return float(value)


def _missing_values(section: dict, path: Path) -> tuple[str, ...]:
    value = section.get("missing_values", list(DEFAULT_MISSING))
    if not isinstance(value, list) or not all(isinstance(token, str) for token in value):
        raise InputError(f"{path}: [federation] missing_values = {value!r} must be a list of strings, "
                         f"e.g. {list(DEFAULT_MISSING)} (an empty cell is always missing)")
    return tuple(token.strip() for token in value)


def _id_rule(section: dict, path: Path) -> IdRule:
    pattern = section.get("id_pattern")
    if pattern is not None and (not isinstance(pattern, str) or not pattern):
        raise InputError(f"{path}: [federation] id_pattern = {pattern!r} must be a non-empty regular expression")
    try:
        return IdRule(_flag(section, "id_fold_case", path), _flag(section, "id_strip_leading_zeros", path), pattern)
    except DataError as error:
        raise InputError(f"{path}: [federation] {error}") from None


def _address(section: dict, key: str, path: Path, where: str) -> tuple[str, int]:
    text = _text(section, key, path, where)
    host, _, port = text.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or "/" in host or host != host.strip():  # ("²" is a digit)
        raise InputError(f"{path}: [{where}] {key} = {text!r} must be HOST:PORT (an IP address or host name, no "
                         "scheme such as http://, no spaces)")
    if not 0 < int(port) < 65536:
        raise InputError(f"{path}: [{where}] {key} = {text!r}: the port must be in 1..65535")
    return host, int(port)


def _max_ids(section: dict, path: Path, parties: int) -> int:
    from ..network.network import SETUP
    from ..secure.align import FRAME_SLACK, KEPT_BYTES_PER_ID, MAX_IDS
    from ..secure.ristretto import POINT_BYTES

    # a list must fit one alignment frame, and the announcement of the union (up to parties x max_ids) one frame
    most = min(MAX_IDS, (SETUP["align"][0] - FRAME_SLACK) // POINT_BYTES,
               (SETUP["kept"][0] - FRAME_SLACK) // (KEPT_BYTES_PER_ID * (parties + 1)))
    value = section.get("max_ids", min(DEFAULT_MAX_IDS, most))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InputError(f"{path}: [federation] max_ids = {value!r} must be an integer in 1..{most}")
    return value


def _pin(section: dict, path: Path, where: str) -> bytes | None:
    if "key" not in section:
        return None
    try:
        return parse_pin(section["key"])
    except IdentityError as error:
        raise InputError(f"{path}: [{where}] key: {error}") from None


PARTY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _parties(raw: dict, path: Path) -> tuple[PartySpec, ...]:
    entries = raw.get("party")
    if not isinstance(entries, list) or len(entries) < 2 or not all(isinstance(e, dict) for e in entries):
        raise InputError(f"{path}: a federation needs at least two [[party]] tables{_array_hint(path)}")
    parties = tuple(_party(entry, i, path) for i, entry in enumerate(entries))
    names = [p.name for p in parties]
    if len(set(names)) != len(names) or AGGREGATOR in names:
        raise InputError(f"{path}: party names must be unique and not {AGGREGATOR!r}; got {names}")
    return parties


def _party(entry: dict, index: int, path: Path) -> PartySpec:
    refuse_unknown(entry, PARTY_KEYS, path, f"[[party]] #{index + 1}")
    name = _text(entry, "name", path, f"party #{index + 1}")
    if not PARTY_NAME.fullmatch(name):  # (review finding: keygen wrote keys/../../x y.key, outside the folder)
        raise InputError(f"{path}: [[party]] #{index + 1}: name = {name[:80]!r}: 1 to 64 letters, digits, '_', '-' or "
                         "'.', starting with a letter or digit (it names the party's key file and its logs)")
    where, base = f"party {name!r}", path.parent
    given = {key: base / _text(entry, key, path, where) if key in entry else None
             for key in (*OWN_PATHS, "identity")}
    model = given["model"]
    blocker = file_in_the_way(model) if model else None
    if blocker is not None:  # (a fuzzer's folder below a file passed `check`)
        raise InputError(f"{path}: [[party]] {name!r}: model = {str(model)!r}: {str(blocker)!r} is a file; model names "
                         "the folder the party keeps its model, checkpoints and ledger in")
    return PartySpec(name, given["train"], given["predict"], given["model"], _pin(entry, path, where),
                     given["identity"], _categorical(entry, path, where))


def _distinct_pins(parties: tuple[PartySpec, ...], aggregator: AggregatorSpec, path: Path) -> None:
    """Two roles pinned with one key: a pin copied into the wrong entry (each role has a key of its own)."""
    seen: dict[bytes, str] = {}
    roles = [(p.name, p.key) for p in parties] + [(AGGREGATOR, aggregator.key)]
    for name, key in roles:
        if key is not None and key in seen:
            raise InputError(f"{path}: {seen[key]} and {name} are pinned with the same key: every participant has "
                             "its own (the `key = ...` line its own `federation keygen` printed); one of the two "
                             "pins was copied into the wrong entry")
        seen.setdefault(key, name)


def _categorical(entry: dict, path: Path, where: str) -> tuple[str, ...]:
    value = entry.get("categorical", [])
    if not isinstance(value, list) or not all(isinstance(name, str) and name.strip() for name in value) \
            or len({name.strip() for name in value}) != len(value):
        raise InputError(f"{path}: [{where}] categorical = {value!r} must be a list of distinct column names, "
                         'e.g. ["smoker", "region"]')
    return tuple(name.strip() for name in value)


def _validation_group(section: dict, path: Path) -> tuple[str, ...]:
    value = section.get("validation_group", [])
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(name, str) and name.strip() for name in value) \
            or len({name.strip() for name in value}) != len(value):
        raise InputError(f"{path}: [federation] validation_group = {section.get('validation_group')!r} must be a "
                         'column name or a list of distinct column names of the active party\'s table, e.g. '
                         '["month", "day"]')
    return tuple(name.strip() for name in value)


def _aggregator(raw: dict, path: Path) -> AggregatorSpec:
    section = raw.get("aggregator", {})
    if not isinstance(section, dict):
        raise InputError(f"{path}: [aggregator] must be a table")
    refuse_unknown(section, AGGREGATOR_KEYS, path, "[aggregator]")
    address = _address(section, "address", path, "aggregator") if "address" in section else None
    identity = path.parent / _text(section, "identity", path, "aggregator") if "identity" in section else None
    return AggregatorSpec(address, _pin(section, path, "aggregator"), identity)


def preset_names() -> list[str]:
    """Every accepted `[model] preset`: a bare schedule, a dataset, or dataset:schedule."""
    return [*SCHEDULES, *(name for dataset in sorted(PRESETS)
                          for name in (dataset, *(f"{dataset}:{s}" for s in sorted(PRESETS[dataset])
                                                  if s != "paper-protocol")))]  # that one reads a simulated split


def _preset(value: object, path: Path) -> tuple[str, str]:
    """(dataset, schedule) of a preset name; an InputError lists the valid names and the closest one."""
    names = preset_names()
    if not isinstance(value, str) or value not in names:
        raise InputError(f"{path}: [model] preset = {value!r} is not a preset{did_you_mean(str(value), names)}; the "
                         f"presets are {', '.join(names)} (see docs/federation-toml.md)")
    if value in SCHEDULES:
        return SCHEDULE_WIDTHS, value
    dataset, _, schedule = value.partition(":")
    return dataset, schedule or "default"


def _method(section: dict, path: Path) -> dict:
    """`method` (a name `--method` takes) as Config's method and the options its name sets; an older file's
    `variant` alone still picks FALSE-VFL's. A baseline that needs to know who holds each record is refused: a
    federation keeps that at the active party."""
    label = section.pop("method", None)
    if label is None:
        return {}
    if not isinstance(label, str) or label not in method_labels():
        raise InputError(f"{path}: [model] method = {label!r}; choose one of {', '.join(method_labels())}")
    method, implied = parse_method(label)
    for name, value in implied.items():
        if section.get(name, value) != value:
            raise InputError(f"{path}: [model] method = {label!r} and {name} = {section[name]!r} disagree; give "
                             "method only")
        section.pop(name, None)  # agreeing: the method sets it (review: it was passed twice, and refused)
    if METHODS[method].needs_patterns:
        raise InputError(f"{path}: [model] method = {label!r} trains on the records every party holds (or groups "
                         "records by who holds them), which a federation keeps at the active party; it runs in "
                         "`simulate` only. A federation trains false-vfl-i, false-vfl-ii or plugvfl")
    return {"method": method, **implied}


def _model(raw: dict, path: Path, parties: int, active: int, task: str) -> Config:
    """The preset (a baseline's schedule where `method` names one) with the explicit settings on top."""
    if not isinstance(raw.get("model", {}), dict):
        raise InputError(f"{path}: model must be a table ([model] with its settings beneath), got "
                         f"model = {raw['model']!r}")
    section = dict(raw.get("model", {}))
    refuse_unknown(section, MODEL_KEYS, path, "[model]")
    method = _method(section, path)
    dataset, schedule = _preset(section.pop("preset", DEFAULT_PRESET), path)
    stages = {}
    for key in ("pretrain", "train"):
        if key in section:
            if not isinstance(section[key], dict):
                raise InputError(f"{path}: [model.{key}] must be a table of {', '.join(STAGE_KEYS)}")
            refuse_unknown(section[key], STAGE_KEYS, path, f"[model.{key}]")
            stages[key] = section.pop(key)
    options = {k: section.pop(k) for k in list(section) if k not in SETTINGS}
    privacy = _privacy(raw, path)  # (outside: its own errors name [privacy], not [model])
    try:
        cfg = make_config(dataset, schedule, **method, **options)
        stages = {k: StageConfig(**{**getattr(cfg, k).__dict__, **_floats(v, StageConfig)}) for k, v in stages.items()}
        cfg = replace(cfg, **_floats(section, Config), **stages, parties=parties, active_party=active, task=task,
                      privacy=privacy).validate()
        method_for(cfg)  # a budget refused for a method that it does not cover
    except (TypeError, ValueError) as error:
        text = str(error)  # Config.validate checks [privacy] too, its messages starting "privacy "
        where = "[privacy] " + text.removeprefix("privacy ") if text.startswith("privacy ") else f"[model] {text}"
        raise InputError(f"{path}: {where}") from error
    _check_device(cfg.device, path)
    return cfg


def _privacy(raw: dict, path: Path) -> PrivacyConfig:
    """`[privacy]`: this party's own budget (epsilon, delta, max_releases_per_row, trust_aggregator) and the noise
    every party must state alike (noise_multiplier, collusion, clip norms: part of the model's fingerprint)."""
    section = raw.get("privacy")
    if section is None:
        return PrivacyConfig()
    if not isinstance(section, dict):
        raise InputError(f"{path}: [privacy] must be a table of {', '.join(PRIVACY_KEYS)}")
    refuse_unknown(section, PRIVACY_KEYS, path, "[privacy]")
    for key, value in section.items():
        if key == "trust_aggregator" and not isinstance(value, bool):
            raise InputError(f"{path}: [privacy] trust_aggregator = {value!r} must be true or false")
        if key != "trust_aggregator" and not real_number(value):
            raise InputError(f"{path}: [privacy] {key} = {value!r} must be a finite number")
    if "delta" in section and not 0 < section["delta"] <= MAX_DELTA:  # before the library's own wider range
        raise InputError(f"{path}: [privacy] delta = {section['delta']:g} must be in (0, {MAX_DELTA:g}]: delta is "
                         "the chance that the guarantee fails outright (a row may then be released whole); choose "
                         "one well below 1 / the number of records, 1e-5 for instance")
    privacy = PrivacyConfig(**_floats(section, PrivacyConfig))
    if section and not privacy.enabled:  # (review finding: noise settings without a budget turned DP off silently)
        given = f"epsilon = {section['epsilon']:g}, not > 0" if "epsilon" in section else "no epsilon"
        raise InputError(f"{path}: [privacy] has {given}: give this party's budget epsilon (with the noise "
                         "every party states), or remove [privacy] to train without differential privacy")
    low, high = MULTIPLIER_RANGE
    if privacy.enabled and "noise_multiplier" not in section:
        raise InputError(f"{path}: [privacy] noise_multiplier is required with epsilon in a federation: every party "
                         "states the same noise; set one (4.0, say) and `federation check --party NAME` says what "
                         "it spends of this party's budget and the smallest that fits")
    if privacy.enabled and not low <= privacy.noise_multiplier <= high:
        raise InputError(f"{path}: [privacy] noise_multiplier = {privacy.noise_multiplier:g} must be in [{low:g}, "
                         f"{high:g}] in a federation: every party states the same noise, and each checks its own "
                         "epsilon budget against it (`federation privacy` shows it)")
    return privacy


def _floats(values: dict, settings: type) -> dict:
    """`values` with a whole number given for a float setting of the dataclass `settings` as that float (review: one
    file's lr = 1 and another's lr = 1.0 said the same, and their fingerprints disagreed)."""
    floats = {f.name for f in fields(settings) if f.type in ("float", float)}
    return {k: float(v) if k in floats and isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in values.items()}


def _check_device(device: str, path: Path) -> None:
    """`[model] device`, this host's own choice, checked on this host."""
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"{path}: [model] device = {device!r}; choose auto, cpu or cuda")
    if device != "cuda":
        return
    import torch  # only asked where the file names cuda

    if not torch.cuda.is_available():
        raise InputError(f'{path}: [model] device = "cuda", but this host has no CUDA device; use "auto" or "cpu"')
