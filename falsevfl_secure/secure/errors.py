"""Exception types of the cryptographic building blocks (`falsevfl_secure.secure`).

They subclass the project's `FalseVflError` (itself a `ValueError`), so callers that catch bad input
generically still catch them, and no raw CrypTen / TenSEAL / torch.distributed exception escapes a
public entry point for input that is merely wrong.
"""

from falsevfl_secure.errors import FalseVflError


class SecureRangeError(FalseVflError):
    """A value outside the range a secure sum carries (or NaN/inf).

    Secret sharing works modulo 2^64 and CKKS modulo its data modulus: a sum beyond the documented
    range would come back as a silently wrong number, so such inputs are refused before they are sent.
    """


class SecureParameterError(FalseVflError):
    """Cryptographic parameters that are insecure (below 128-bit security) or cannot work."""


class SecureMessageError(FalseVflError):
    """A ciphertext or share that is malformed, truncated, tampered with or of the wrong shape/count."""
