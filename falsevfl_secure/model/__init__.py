"""Party-side and active-side modules of FALSE-VFL."""

from .active import ActiveModel
from .mlp import initialise, mlp
from .party import PartyModel
from .party_stack import PartyStack

__all__ = ["ActiveModel", "PartyModel", "PartyStack", "initialise", "mlp"]
