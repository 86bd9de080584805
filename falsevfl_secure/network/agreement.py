"""What every participant of a run must agree on, derived by each from its own configuration.

An `Agreement` is a flat record of named fields (the protocol, the parties and their pinned keys, the
active party, the aggregator's key, the two-party consent, the model's fingerprint, the alignment bound,
the ID normalisation, the command). Each role builds it from its own file; at start-up every role's
record is signed and compared with every other's (`network.handshake`), and a difference ends the run
at every role with one line naming the field, before anything else is sent. The record holds only what
the participants share anyway: names, public keys, settings; never data.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ProtocolError

_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Agreement:
    fields: Mapping[str, object]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", dict(sorted(self.fields.items())))
        json.dumps(self.fields)  # JSON values only: a record must travel and compare exactly

    def canonical(self) -> bytes:
        """The record as canonical JSON (sorted keys, no spaces): what is signed and compared."""
        return json.dumps(self.fields, sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> bytes:
        return hashlib.sha256(b"falsevfl/agreement/v1\0" + self.canonical()).digest()

    def get(self, field: str) -> object:
        return self.fields[field]

    def differences(self, other: Agreement) -> list[str]:
        """The fields whose values differ (a field one side lacks differs)."""
        keys = sorted(set(self.fields) | set(other.fields))
        return [k for k in keys if self.fields.get(k, _MISSING) != other.fields.get(k, _MISSING)]

    @classmethod
    def from_json(cls, record: object, sender: str) -> Agreement:
        """A received record, checked to be a flat mapping of JSON values (lists of scalars allowed)."""
        if not isinstance(record, dict) or not all(isinstance(k, str) for k in record):
            raise ProtocolError(f"the agreement record of {sender} is not a mapping of named fields")
        for key, value in record.items():
            if not _json_value(value):
                raise ProtocolError(f"the agreement record of {sender}: field {key!r} is not a plain value")
        return cls(record)


_MISSING = object()
NAMED_FIRST = ("[model] preset", "[model] method", "[model] auto_schedule")  # a difference here moves many others
_NAMED_SETTINGS = 4  # a difference in more settings names the first few
_SHOWN = 60  # characters of a value or a field a peer sent, at most, in a message
_SETTING = re.compile(r"\[[a-z][a-z_.]*\] [a-z][a-z0-9_]*")  # a setting's name as a file writes it: shown as it is


def named_differences(mine: Agreement, theirs: Agreement, me: str, them: str) -> str | None:
    """The settings two records differ in, as a file writes them ("[model.pretrain] lr (lab: 4, clinic: 1)"), the
    ones that move many others first, a section one side lacks named once; None where none of this party's own
    settings differs. Only names of a setting's form are named here (a peer chooses its record's names: any other is
    the caller's to quote and cut)."""
    own, other = mine.fields, theirs.fields
    settings = [f for f in mine.differences(theirs) if is_setting(f)]  # (a peer's other names: the caller's)
    if not settings:
        return None
    sections = {f.split("]")[0] + "]" for f in settings}
    whole = {s for s in sections if not any(k.startswith(s) for k in other) or not any(k.startswith(s) for k in own)}
    named = [f"{s} ({them}: {_section(other, s)}; {me}: {_section(own, s)})" for s in sorted(whole)]
    rest = sorted((f for f in settings if f.split("]")[0] + "]" not in whole),
                  key=lambda f: (f not in NAMED_FIRST, NAMED_FIRST.index(f) if f in NAMED_FIRST else 0))
    named += [f"{f} ({them}: {_value(other, f)}, {me}: {_value(own, f)})" for f in rest]
    more = f" and {len(named) - _NAMED_SETTINGS} more settings" if len(named) > _NAMED_SETTINGS else ""
    return ", ".join(named[:_NAMED_SETTINGS]) + more


def is_setting(field: str) -> bool:
    """Whether a field is named as a file writes a setting ("[model.train] lr"): `named_differences` names it."""
    return _SETTING.fullmatch(field) is not None


def _value(fields: Mapping[str, object], field: str) -> str:
    return shown(fields[field]) if field in fields else "unset"


def _section(fields: Mapping[str, object], section: str) -> str:
    """A whole section as one side has it: its settings, or 'none'."""
    given = [f"{k.removeprefix(section).strip()} {shown(v)}" for k, v in fields.items() if k.startswith(section)]
    return ", ".join(given[:3]) + (", ..." if len(given) > 3 else "") if given else "none"


def shown(value: object) -> str:
    """`value`'s repr, cut to a line's share (a peer chooses it)."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def _json_value(value: object, depth: int = 0) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, list) and depth < 2:
        return all(_json_value(v, depth + 1) for v in value)
    return False
