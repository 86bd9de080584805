"""What a role saw: the messages it received and its own contributions, for the threat-model audits.

A `View` is recorded by a role when asked (`simulate --audit`, the attack tests): every round message it
received ("received"), every sum it obtained ("revealed") and every contribution it sent ("sent"), with the
round, the peer and the protection of the round, and every other message it received ("control": the
set-up and control steps of `transport.rounds.CONTROL_STEPS`, with their tag in place of a round).
Views are written with numpy's `savez` and read with `allow_pickle=False`: a view file written by another
process can hold arrays and text, never code.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import FalseVflError
from ..fsio import atomic_write

KINDS = ("received", "revealed", "sent", "control")  # control: a set-up or control step's message, received


@dataclass(frozen=True)
class Entry:
    round: str
    kind: str  # one of KINDS
    peer: int  # the sender of a received message; the receiver of a sent one; -1 for a revealed sum
    protection: str  # "clear", "secret-shared", "ckks"
    value: np.ndarray  # float32/float64 values, int64 ring elements, or uint8 bytes of a ciphertext frame


class View(list):
    """The entries one role recorded, in order."""

    def add(self, round: str, kind: str, peer: int, protection: str, value) -> None:
        self.append(Entry(round, kind, peer, protection, _array(value)))

    def of(self, kind: str) -> list[Entry]:
        return [e for e in self if e.kind == kind]


def _array(value) -> np.ndarray:
    if isinstance(value, bytes | bytearray):
        return np.frombuffer(bytes(value), dtype=np.uint8).copy()
    if torch.is_tensor(value):
        return value.detach().cpu().numpy().copy()
    return np.asarray(value).copy()


def save_view(path: Path | str, view: View) -> None:
    """Write a view atomically as an .npz of plain arrays plus a JSON index."""
    index = [{"round": e.round, "kind": e.kind, "peer": e.peer, "protection": e.protection} for e in view]
    arrays = {f"value{i}": e.value for i, e in enumerate(view)}
    buffer = io.BytesIO()
    np.savez(buffer, index=np.array(json.dumps(index)), **arrays)
    atomic_write(path, buffer.getvalue(), private=True)  # the party's own contributions in clear: owner only


def load_view(path: Path | str) -> View:
    """Read a view that `save_view` wrote; anything else (a pickle, a truncated file) is refused."""
    try:
        with np.load(path, allow_pickle=False) as data:
            index = json.loads(str(data["index"]))
            view = View(Entry(e["round"], e["kind"], int(e["peer"]), e["protection"], data[f"value{i}"])
                        for i, e in enumerate(index))
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise FalseVflError(f"{path}: not a recorded view ({type(error).__name__}: {error})") from error
    if any(e.kind not in KINDS for e in view):
        raise FalseVflError(f"{path}: unknown entry kind")
    return view
