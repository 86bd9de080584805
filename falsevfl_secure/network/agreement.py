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


def _json_value(value: object, depth: int = 0) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, list) and depth < 2:
        return all(_json_value(v, depth + 1) for v in value)
    return False
