"""Transports implement the two differentiable cross-party primitives, `aggregate` and `broadcast`."""

from .accounting import CommLog
from .local import LocalTransport
from .rounds import ADJOINT, FORWARD_ROUNDS, STAGE1_ROUNDS

__all__ = ["ADJOINT", "FORWARD_ROUNDS", "STAGE1_ROUNDS", "CommLog", "LocalTransport"]
