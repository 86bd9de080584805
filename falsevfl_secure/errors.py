"""The documented exception types of the model, training and protocol layers.

Every public entry point answers bad input with one of these (or `DataError` from the data layer),
never with a raw traceback from inside torch, CrypTen or TenSEAL.
"""

import difflib
from collections.abc import Sequence


def did_you_mean(name: str, names: Sequence[str]) -> str:
    """" (did you mean 'x'?)" for the closest of `names` (case and spaces ignored first), else ""."""
    folded = {candidate.strip().casefold(): candidate for candidate in names}
    close = difflib.get_close_matches(name.strip().casefold(), list(folded), n=1)  # (an exact fold scores 1)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""


class FalseVflError(ValueError):
    """Base class: bad input to the model, the trainer, a transport or the CLI."""


class InputError(FalseVflError):
    """Wrong shapes or widths, NaN/inf values, labels out of range, empty or all-missing batches."""


class ProtocolError(FalseVflError):
    """A message that does not match its round (sender, receiver, shape, dtype, order, values)."""


class PartyFailure(RuntimeError):
    """A party process died or stalled; the message names the party and the round."""
