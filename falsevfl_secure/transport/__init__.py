"""Transports carry the two differentiable cross-party primitives, `aggregate` and `broadcast`, round by round."""

from .accounting import CommLog
from .base import Transport
from .in_process import LocalTransport
from .protocols import PROTOCOLS, Protocol, protocol_named, register
from .rounds import AGGREGATES, VOCABULARY, Round, RoundTable

__all__ = ["AGGREGATES", "PROTOCOLS", "VOCABULARY", "CommLog", "LocalTransport", "Protocol", "Round", "RoundTable",
           "Transport", "protocol_named", "register"]
