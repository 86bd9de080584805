"""The one documented exception type of the data layer.

Every bad input to the data layer (a missing or corrupt file, a checksum mismatch, a bad
mechanism spec, a probability outside [0, 1], an impossible party count, ...) is answered with a
`DataError` whose message names the offending path or argument. It derives from the package-wide
`FalseVflError` (itself a `ValueError`), so the CLI reports it as a clear message, not a traceback.
"""

from __future__ import annotations

from ..errors import FalseVflError


class DataError(FalseVflError):
    """Bad data input or bad arguments to the data layer; the message names what is wrong and where."""
