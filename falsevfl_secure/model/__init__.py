"""Party-side and active-side modules of FALSE-VFL."""

from .active import ActiveModel
from .mlp import mlp
from .party import PartyModel

__all__ = ["ActiveModel", "PartyModel", "mlp"]
