"""The one place that imports CrypTen.

CrypTen 0.4.1 (the last release) does ``from torch.onnx._internal.registration import registry`` in
``crypten/nn/onnx_converter.py``, which runs on ``import crypten``; torch >= 2.9 moved that module to
``torch.onnx._internal.torchscript_exporter.registration``. `import_crypten` aliases the new module under
the old name in ``sys.modules`` before importing CrypTen; nothing else is needed (CrypTen's other optional
dependencies are imported lazily by code we never call, and its runtime needs are in pyproject.toml
because it is installed with ``--no-deps``). The import is lazy and cached, so importing this package
stays cheap and a process that never touches CrypTen never loads it.

CrypTen's metadata declares torchvision, tensorboard, `future` and the withdrawn `sklearn` package, none of
which ``import crypten`` needs: torchvision only in ``crypten.models`` and tensorboard only in
``crypten.nn.tensorboard`` (neither imported by ``crypten`` itself), and the ``builtins`` module it imports
is Python 3's own (`future` backports it to Python 2). What it does import is torch, omegaconf and PyYAML
(``crypten.config``) and onnx (``crypten.nn.onnx_converter``). `check_install` proves this on the installed
environment: it imports CrypTen in the current process with those four names made unimportable.

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
from importlib import metadata
from types import ModuleType

from .errors import SecureParameterError

_OLD_REGISTRATION = "torch.onnx._internal.registration"
_NEW_REGISTRATION = "torch.onnx._internal.torchscript_exporter.registration"
#: Declared by CrypTen 0.4.1's metadata, not needed to import it (see the module docstring).
DECLARED_NOT_NEEDED = ("future", "sklearn", "tensorboard", "torchvision")
#: (distribution, module) pairs that ``import crypten`` does import.
RUNTIME_NEEDS = (("torch", "torch"), ("omegaconf", "omegaconf"), ("onnx", "onnx"), ("PyYAML", "yaml"))


@functools.cache
def import_crypten() -> ModuleType:
    """Import CrypTen once (aliasing the torch module it expects) and return the ``crypten`` module."""
    try:
        importlib.import_module(_OLD_REGISTRATION)
    except ModuleNotFoundError:
        # torch >= 2.9: the registry CrypTen's ONNX converter imports at module level lives here now.
        sys.modules[_OLD_REGISTRATION] = importlib.import_module(_NEW_REGISTRATION)
    return importlib.import_module("crypten")


class _Blocked:
    """A meta-path finder under which the modules it names (and their submodules) cannot be imported."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"{name} (blocked: CrypTen must import without it)", name=name)
        return None


def check_install() -> str:
    """Import CrypTen with `DECLARED_NOT_NEEDED` unimportable and return one line saying what it used.

    Must run in a process that has not imported CrypTen yet (the Makefile runs it after installing).
    Raises `SecureParameterError` naming the module when the import fails (a real need is missing, or
    CrypTen does need one of the declared packages after all)."""
    if "crypten" in sys.modules:
        raise SecureParameterError("check_install needs a process that has not imported CrypTen yet")
    blocker = _Blocked(("past", *DECLARED_NOT_NEEDED))
    sys.meta_path.insert(0, blocker)
    try:
        import_crypten()
    except ImportError as exc:
        import_crypten.cache_clear()
        raise SecureParameterError(f"CrypTen does not import: {exc} (`make venv` installs it and what it needs)"
                                   ) from None
    finally:
        sys.meta_path.remove(blocker)
    needs = ", ".join(f"{dist} {metadata.version(dist)}" for dist, module in RUNTIME_NEEDS if module in sys.modules)
    return (f"CrypTen {metadata.version('crypten')} imports with its runtime needs present ({needs}); its "
            f"declared {', '.join(DECLARED_NOT_NEEDED)} are not needed (the import ran with them blocked)")


def main() -> int:
    """`python -c 'from falsevfl_secure.secure.crypten_shim import main; main()'`: the Makefile's check."""
    try:
        print(check_install())
    except SecureParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
