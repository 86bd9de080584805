"""The learning methods, each a `Method` (methods/base.py states the contract): FALSE-VFL-I and -II, and
the paper's baselines (App. D.1) Vanilla VFL, LASER-VFL, PlugVFL and FedHSSL. Adding a method is a module
here with one subclass, its line in `METHODS` below, and its schedules in `config.METHOD_SCHEDULES`."""

from __future__ import annotations

from ..config import Config
from .base import Method, Objective
from .false_vfl import FalseVfl, FalseVflMoments
from .fedhssl import FedHssl
from .fusion import EmbeddingFusion
from .laser import Laser
from .plugvfl import PlugVfl
from .vanilla import Vanilla

METHODS: dict[str, type[Method]] = {m.name: m for m in (FalseVfl, Vanilla, Laser, PlugVfl, FedHssl)}


def method_for(cfg: Config) -> Method:
    """The method a configuration trains."""
    return METHODS[cfg.method].configured(cfg)


__all__ = ["METHODS", "EmbeddingFusion", "FalseVfl", "FalseVflMoments", "FedHssl", "Laser", "Method", "Objective",
           "PlugVfl", "Vanilla", "method_for"]
