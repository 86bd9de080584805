"""Transports carry the two differentiable cross-party primitives, `aggregate` and `broadcast`, round by round."""

from .accounting import CommLog
from .base import Transport
from .local import LocalTransport
from .protocols import PROTOCOLS, Protocol, protocol_named
from .rounds import AGGREGATES, FORWARD, ROUNDS, STAGE_ROUNDS, Round

__all__ = ["AGGREGATES", "FORWARD", "PROTOCOLS", "ROUNDS", "STAGE_ROUNDS", "CommLog", "LocalTransport", "Protocol",
           "Round", "Transport", "protocol_named"]
