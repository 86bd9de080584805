"""The one place that imports CrypTen.

CrypTen 0.4.1 (the last release) does ``from torch.onnx._internal.registration import registry`` in
``crypten/nn/onnx_converter.py``, which runs on ``import crypten``; torch >= 2.9 moved that module to
``torch.onnx._internal.torchscript_exporter.registration``. `import_crypten` aliases the new module under
the old name in ``sys.modules`` before importing CrypTen; nothing else is needed (CrypTen's other optional
dependencies are imported lazily by code we never call, and its runtime needs are in pyproject.toml
because it is installed with ``--no-deps``). The import is lazy and cached, so importing this package
stays cheap and a process that never touches CrypTen never loads it.

The `mpc` protocol keeps CrypTen's ring (Z_2^64 as wrapping int64) and fixed-point convention (16
fractional bits, `secure.fixed_point`), but draws nothing from CrypTen: its pseudo-random zero sharing
comes from PyTorch's Mersenne Twister generators (32 effective seed bits) with seeds sent in clear,
which one party can search. The tests use CrypTen itself to check that our shares are valid
CrypTen shares and that our decoder is exact where CrypTen's is off by one.
"""

from __future__ import annotations

import functools
import importlib
import sys
from types import ModuleType

_OLD_REGISTRATION = "torch.onnx._internal.registration"
_NEW_REGISTRATION = "torch.onnx._internal.torchscript_exporter.registration"


@functools.cache
def import_crypten() -> ModuleType:
    """Import CrypTen once (aliasing the torch module it expects) and return the ``crypten`` module."""
    try:
        importlib.import_module(_OLD_REGISTRATION)
    except ModuleNotFoundError:
        # torch >= 2.9: the registry CrypTen's ONNX converter imports at module level lives here now.
        sys.modules[_OLD_REGISTRATION] = importlib.import_module(_NEW_REGISTRATION)
    return importlib.import_module("crypten")
