"""Fixed-point numbers on CrypTen's ring: Z_2^64 stored as wrapping int64, 16 fractional bits.

Both secure protocols carry a sum as the sum of its addends' fixed-point encodings: `mpc` adds them on
the ring, `he` encrypts them and rounds every decryption back onto the same grid (`secure.ckks`), so the
two secure protocols reveal exactly the same number, a deterministic function of the inputs.

`encode_fixed_point` rounds to nearest exactly (CrypTen truncates toward zero in the input's dtype, and
float32 loses bits above 2^24) and refuses values whose sum could wrap; `decode_fixed_point` divides by
2^16 exactly (CrypTen's ``FixedPointEncoder.decode`` floor-divides negatives by 2^16 - 1: raw -131071,
-1.99998, decodes to -2.99998).
"""

from __future__ import annotations

import math

import torch

from .errors import SecureRangeError

PRECISION_BITS = 16  # CrypTen's default (cfg.encoder.precision_bits)
RING_BITS = 64


def max_safe_abs(n_addends: int = 1, precision_bits: int = PRECISION_BITS) -> float:
    """Largest |x| such that the sum of `n_addends` encodings of that size stays inside int64."""
    if n_addends < 1:
        raise ValueError(f"n_addends must be >= 1, got {n_addends}")
    return float((2 ** (RING_BITS - 1) - 1) // n_addends) / 2**precision_bits


def encode_fixed_point(x: torch.Tensor, precision_bits: int = PRECISION_BITS, n_addends: int = 1,
                       limit: float | None = None) -> torch.Tensor:
    """int64 fixed point of `x` (round to nearest of ``x * 2**precision_bits``), range-guarded.

    `n_addends` values of this size will be summed; `limit` (default: the ring's `max_safe_abs`) is the
    largest |x| the caller's protocol carries. NaN/inf and values beyond the limit raise `SecureRangeError`.
    """
    if not torch.is_tensor(x):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    limit = max_safe_abs(n_addends, precision_bits) if limit is None else limit
    # float32 stays float32: scaling by a power of two and rounding to an integer are exact there.
    xd = x.detach().to(device="cpu", dtype=torch.float32 if x.dtype == torch.float32 else torch.float64)
    if xd.numel() == 0:
        return torch.zeros(xd.shape, dtype=torch.int64)
    max_abs = float(xd.abs().max())  # NaN or inf if any value is: one pass checks both
    if not math.isfinite(max_abs):
        raise SecureRangeError(f"cannot encode {int((~torch.isfinite(xd)).sum())} NaN/inf value(s)")
    if max_abs >= limit:
        raise SecureRangeError(f"a value of magnitude {max_abs:.6g} is outside the range |x| < {limit:.6g} "
                               f"that a sum of {n_addends} addend(s) carries")
    return torch.round(xd * 2**precision_bits).to(torch.int64)


def decode_fixed_point(raw: torch.Tensor, precision_bits: int = PRECISION_BITS) -> torch.Tensor:
    """``raw.double() / 2**precision_bits``: exact while |raw| < 2^53."""
    if not torch.is_tensor(raw) or raw.dtype != torch.int64:
        raise TypeError(f"expected an int64 tensor of ring elements, got {getattr(raw, 'dtype', raw)}")
    return raw.double() / 2**precision_bits


def round_to_grid(x: torch.Tensor, precision_bits: int = PRECISION_BITS) -> torch.Tensor:
    """The value of `x`'s encoding, as float64: what a secure sum carries for `x`."""
    return torch.round(x.detach().double() * 2**precision_bits) / 2**precision_bits
