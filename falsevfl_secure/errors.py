"""The documented exception types of the model, training and protocol layers.

Every public entry point answers bad input with one of these (or `DataError` from the data layer),
never with a raw traceback from inside torch, CrypTen or TenSEAL.
"""


class FalseVflError(ValueError):
    """Base class: bad input to the model, the trainer, a transport or the CLI."""


class InputError(FalseVflError):
    """Wrong shapes or widths, NaN/inf values, labels out of range, empty or all-missing batches."""


class ProtocolError(FalseVflError):
    """A message that does not match its round (sender, receiver, shape, dtype, order, values)."""


class PartyFailure(RuntimeError):
    """A party process died or stalled; the message names the party and the round."""
