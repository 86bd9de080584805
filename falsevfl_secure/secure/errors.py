"""Exception types of the cryptographic building blocks (`falsevfl_secure.secure`, `crypten_shim`).

They subclass the project's `FalseVflError` (itself a `ValueError`), so callers that catch bad input
generically still catch them, and no raw CrypTen / TenSEAL / torch.distributed exception escapes a
public entry point for input that is merely wrong.
"""

from falsevfl_secure.errors import FalseVflError


class SecureRangeError(FalseVflError):
    """A value cannot be fixed-point encoded without wrapping the 64-bit ring (or is NaN/inf).

    Secret sharing works modulo 2^64: a sum that leaves the signed 64-bit range comes back as a
    silently wrong number, so out-of-range inputs are refused before they are shared.
    """


class SecureParameterError(FalseVflError):
    """Cryptographic parameters that are insecure (below 128-bit security) or cannot work."""


class SecureMessageError(FalseVflError):
    """A ciphertext or share that is malformed, truncated, tampered with or of the wrong shape/count."""
