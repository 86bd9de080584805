"""A fixed-schema encoding for reports that cross processes: JSON for structure, numpy's npz for arrays.

Used where a role hands values to the process that started it (sessions, benchmarks). Decoding never
unpickles: `np.load(allow_pickle=False)` and `json.loads` accept data, not code.
"""

from __future__ import annotations

import io
import json

import numpy as np

from ..errors import FalseVflError

_ARRAY = "__array__"


def pack(value: object) -> bytes:
    """Bytes of a tree of dicts, lists, strings, numbers, None and numpy arrays."""
    arrays: list[np.ndarray] = []

    def flatten(v):
        if isinstance(v, np.ndarray | np.generic):
            arrays.append(np.asarray(v))
            return {_ARRAY: len(arrays) - 1}
        if isinstance(v, dict):
            return {str(k): flatten(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [flatten(x) for x in v]
        return v

    tree = json.dumps(flatten(value))
    buffer = io.BytesIO()
    np.savez(buffer, tree=np.array(tree), **{f"a{i}": a for i, a in enumerate(arrays)})
    return buffer.getvalue()


def unpack(data: bytes) -> object:
    """The inverse of `pack`; anything else is refused."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        tree = json.loads(str(arrays.pop("tree")))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as error:
        raise FalseVflError(f"not a packed report ({type(error).__name__}: {error})") from error

    def restore(v):
        if isinstance(v, dict):
            return arrays[f"a{v[_ARRAY]}"] if set(v) == {_ARRAY} else {k: restore(x) for k, x in v.items()}
        if isinstance(v, list):
            return [restore(x) for x in v]
        return v

    return restore(tree)
