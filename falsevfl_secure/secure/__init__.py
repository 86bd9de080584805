"""Cryptographic building blocks: fixed-point secret-shared sums (CrypTen) and CKKS aggregation (TenSEAL).

Submodules are imported explicitly (`falsevfl_secure.secure.mpc_sum`, `falsevfl_secure.secure.ckks`) so that
importing the package does not load CrypTen or TenSEAL.
"""

from .errors import SecureMessageError, SecureParameterError, SecureRangeError

__all__ = ["SecureMessageError", "SecureParameterError", "SecureRangeError"]
