"""The one place that imports CrypTen, plus exact fixed-point encoding/decoding for its 64-bit ring.

Why a shim:

* CrypTen 0.4.1 (the last release) does ``from torch.onnx._internal.registration import registry``
  in ``crypten/nn/onnx_converter.py``, which runs on ``import crypten``. torch >= 2.9 moved that module
  to ``torch.onnx._internal.torchscript_exporter.registration``, so the import fails. We alias the
  new module under the old name in ``sys.modules`` before importing CrypTen. Nothing else is needed:
  CrypTen's other optional dependencies are imported lazily by code we never call (``tensorboard``
  only by ``crypten.nn.tensorboard``, ``torchvision`` only by ``crypten.models``, neither imported by
  ``import crypten``), and its real runtime needs (omegaconf, onnx, pyyaml, numpy) are declared in
  pyproject.toml because CrypTen is installed with ``--no-deps``.
* The import is lazy and cached (`import_crypten`) so that importing our package stays cheap and a
  process that never does MPC never loads CrypTen.
* CrypTen's ``FixedPointEncoder.decode`` floor-divides negative values by ``2**16 - 1`` instead of
  ``2**16``; some negatives come back 1.0 too low (raw ``-131071`` = -1.99998 decodes to -2.99998;
  in general about n-1 of the 2^16 raw values just above each negative integer -n are affected).
  `decode_fixed_point` is the exact replacement. CrypTen's encoder also truncates toward zero in the
  input's dtype (float32 loses bits above 2^24); `encode_fixed_point` rounds to nearest exactly
  and refuses values whose sum could wrap the ring.
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
from types import ModuleType

import torch

from falsevfl_secure.secure.errors import SecureRangeError

__all__ = [
    "DEFAULT_PRECISION_BITS",
    "RING_BITS",
    "decode_fixed_point",
    "encode_fixed_point",
    "import_crypten",
    "max_safe_abs",
]

#: CrypTen's default number of fractional bits (``cfg.encoder.precision_bits``).
DEFAULT_PRECISION_BITS = 16
#: CrypTen shares live in the ring Z_{2^64}, stored as signed int64.
RING_BITS = 64

_OLD_REGISTRATION = "torch.onnx._internal.registration"
_NEW_REGISTRATION = "torch.onnx._internal.torchscript_exporter.registration"


@functools.cache
def import_crypten() -> ModuleType:
    """Import CrypTen once (aliasing the torch module it expects) and return the ``crypten`` module.

    Cached, so every caller gets the same module and the alias is installed at most once.
    """
    try:
        importlib.import_module(_OLD_REGISTRATION)
    except ModuleNotFoundError:
        # torch >= 2.9: the registry CrypTen's ONNX converter imports at module level lives here now.
        sys.modules[_OLD_REGISTRATION] = importlib.import_module(_NEW_REGISTRATION)
    return importlib.import_module("crypten")


def max_safe_abs(n_addends: int = 1, precision_bits: int = DEFAULT_PRECISION_BITS) -> float:
    """Largest |x| such that the sum of `n_addends` encoded values of that size stays inside int64.

    The sum of the true (unmasked) encoded values must lie in [-2^63, 2^63) for the revealed ring element
    to decode to the right number; the masks themselves may wrap freely.
    """
    if n_addends < 1:
        raise ValueError(f"n_addends must be >= 1, got {n_addends}")
    return float((2 ** (RING_BITS - 1) - 1) // n_addends) / 2**precision_bits


def encode_fixed_point(
    x: torch.Tensor, precision_bits: int = DEFAULT_PRECISION_BITS, n_addends: int = 1
) -> torch.Tensor:
    """Encode `x` as int64 fixed point (round to nearest of ``x * 2**precision_bits``), range-guarded.

    `n_addends` is how many values of this size will be summed in the ring (the number of parties): the
    guard refuses `x` when ``n_addends * max|x| * 2**precision_bits`` could exceed the signed 64-bit
    range, because the revealed sum would then wrap to a silently wrong value. NaN/inf are refused too.

    Raises:
        SecureRangeError: non-finite values, or values too large for `n_addends` addends.
    """
    if not torch.is_tensor(x):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if n_addends < 1:
        raise ValueError(f"n_addends must be >= 1, got {n_addends}")
    # float32 stays float32: scaling by 2^precision_bits is exact (a shift of the exponent), and
    # rounding a float32 to an integer is exact (from 2^23 up every float32 already is one), so this
    # gives bit for bit the float64 result at a third of the memory traffic. Other dtypes go to float64.
    xd = x.detach().to(device="cpu", dtype=torch.float32 if x.dtype == torch.float32 else torch.float64)
    if xd.numel() == 0:
        return torch.zeros(xd.shape, dtype=torch.int64)
    max_abs = float(xd.abs().max())  # NaN if any value is NaN, inf if any is inf: one pass checks both
    if not math.isfinite(max_abs):
        bad = int((~torch.isfinite(xd)).sum())
        raise SecureRangeError(f"cannot fixed-point encode a tensor with {bad} NaN/inf value(s)")
    scale = 2**precision_bits
    # Python ints: exact, no float rounding in the bound itself.
    worst_sum = n_addends * (math.floor(max_abs * scale) + 1)
    if worst_sum > 2 ** (RING_BITS - 1) - 1:
        raise SecureRangeError(
            f"value of magnitude {max_abs:.6g} is outside the safe fixed-point range: with "
            f"{precision_bits} fractional bits and {n_addends} addend(s), |x| must be below "
            f"{max_safe_abs(n_addends, precision_bits):.6g} or the 64-bit ring sum could wrap"
        )
    return torch.round(xd * scale).to(torch.int64)


def decode_fixed_point(raw: torch.Tensor, precision_bits: int = DEFAULT_PRECISION_BITS) -> torch.Tensor:
    """Decode revealed int64 ring elements exactly: ``raw.double() / 2**precision_bits`` (float64).

    Replaces CrypTen's ``FixedPointEncoder.decode``, which is off by exactly 1.0 for some negatives.
    Exact while |raw| < 2^53; beyond that float64 rounding (relative 2^-53) applies.
    """
    if not torch.is_tensor(raw) or raw.dtype != torch.int64:
        raise TypeError(
            f"expected an int64 tensor of revealed ring elements, got {getattr(raw, 'dtype', raw)}"
        )
    return raw.double() / 2**precision_bits
