"""The learning methods, each a `Method` (methods/base.py states the contract): FALSE-VFL-I and -II, and
the paper's baselines (App. D.1) Vanilla VFL, LASER-VFL, PlugVFL and FedHSSL. Adding a method is a module
here whose subclass declares its names, options, schedules and rounds and registers itself (`@register`),
plus its import line below. `make_config` builds a configuration for any registered method; `build_node`
assembles what one process hosts for a configuration's method (node.py imports no method)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace

import torch

from ..config import Config, dataset_preset
from ..data.loaders import canonical_name
from ..errors import InputError
from ..heap import keep_freed_memory
from ..model import PartyStack
from ..model.likelihood import CellLayout
from ..model.private_sgd import PrivateGradients
from ..node import ActiveRole, Node, PartyRole, flush_denormals
from ..placement import Active
from ..privacy import noise_multiplier
from ..randomness import RoleRandomness, RoleSecret
from ..transport.base import Transport
from ..transport.ciphers.noise import NoiseSpec, NoiseStage
from .base import METHODS, Method, Objective, Option, method_named, register
from .fusion import EmbeddingFusion

# Each method's module registers it, in this order: FALSE-VFL, then the baselines as App. D.1 lists them
# isort: off
from .false_vfl import FalseVfl, FalseVflMoments
from .vanilla import Vanilla
from .laser import Laser
from .plugvfl import PlugVfl
from .fedhssl import FedHssl
# isort: on

SETTINGS = frozenset(f.name for f in fields(Config))  # what is not one of them is a method's own option


def method_for(cfg: Config) -> Method:
    """The method a configuration trains, its options and its fit with the rest of `cfg` checked."""
    method = method_named(cfg.method).configured(cfg)
    method.check(cfg)
    return method


def method_labels() -> dict[str, tuple[str, dict]]:
    """Every name `--method` takes: (method, the options it sets), in the registry's order."""
    return {label: (m.name, implied) for m in METHODS.values() for label, implied in m.labels.items()}


def parse_method(label: str) -> tuple[str, dict]:
    """(method, options) of a method's name; an unknown name is refused, listing the valid ones."""
    labels = method_labels()
    if label not in labels:
        raise InputError(f"unknown method {label!r}; choose one of {', '.join(labels)}")
    return labels[label]


def make_config(dataset: str = "digits", preset: str = "quick", **overrides) -> Config:
    """The preset for `dataset` (under a baseline its own schedule on top of the dataset's widths), with explicit
    overrides (None values are ignored): Config's settings, or the method's own options by name."""
    key = canonical_name(dataset)
    given = {k: v for k, v in overrides.items() if v is not None}
    method = method_named(given.pop("method", Config.method))
    given = {**given.pop("options", {}), **given}
    values = {**dataset_preset(key, preset), **method.schedule(key, preset), **given}
    # a preset's options are FALSE-VFL's (the dataset presets are its schedules): another method keeps its own
    options = {k: v for k, v in values.items() if k not in SETTINGS and (k in given or k in method.options)}
    settings = {k: v for k, v in values.items() if k in SETTINGS}
    cfg = replace(Config(dataset=key, method=method.name), **settings, options=method.resolve(options)).validate()
    method_for(cfg)
    return cfg


def noise_stages(cfg: Config, randomness: Mapping[int, RoleRandomness]) -> dict[int, NoiseStage]:
    """Each hosted party's differential-privacy stage (none without a privacy budget): the agreed clip norms
    and noise multiplier, and a secret stream of the party's own."""
    privacy = cfg.privacy
    if not privacy.enabled:
        return {}
    spec = NoiseSpec(privacy.clips, noise_multiplier(cfg), privacy.collusion)
    return {k: NoiseStage(spec, rand.stream("dp-noise")) for k, rand in randomness.items()}


def private_gradients(cfg: Config, parties: Mapping[int, PartyRole], randomness: Mapping[int, RoleRandomness]
                      ) -> dict[int, PrivateGradients]:
    """Each hosted party's DP-SGD (none without a privacy budget), noised from its own secret stream."""
    if not cfg.privacy.enabled:
        return {}
    z = noise_multiplier(cfg)
    try:
        return {k: PrivateGradients(role.model, cfg.privacy.clip_gradient, z, randomness[k].stream("dp-sgd"))
                for k, role in parties.items()}
    except ValueError as error:
        raise InputError(f"privacy: {error}") from None


def build_node(cfg: Config, widths: Mapping[int, int], n_classes: int | None, transport: Transport,
               device: torch.device, secrets: Mapping[int, RoleSecret] | None = None,
               layouts: Mapping[int, CellLayout] | None = None, own_extra: int = 0,
               method: Method | None = None) -> Node:
    """A node hosting the parties in `widths` (party -> block width) and, when `n_classes` is given, the
    active party's label side, for the configuration's method (whose round table the transport then
    checks every message against). `secrets` (party -> RoleSecret) is for tests and resumed runs; a party
    without one draws a fresh secret from the operating system. `layouts`: a party's cell kinds (its own
    encoding's; a party without one has numeric cells only). `own_extra`: the width of the active party's
    extra discriminator inputs (`HostedData.own_extra`). `method`: the configuration's unless given."""
    flush_denormals()
    keep_freed_memory()
    method, secrets, layouts = method or method_for(cfg), secrets or {}, layouts or {}
    transport.use(method.rounds, method.wire_sizes(cfg))
    randomness = {k: RoleRandomness(secrets.get(k) or RoleSecret.fresh()) for k in widths}
    transport.use_noise(noise_stages(cfg, randomness))
    parties = {k: PartyRole(k, method.build_party(cfg, d, randomness[k], layouts.get(k)).to(device), randomness[k])
               for k, d in sorted(widths.items())}
    active: Active[ActiveRole] = Active.absent()
    if n_classes is not None:
        rand = randomness[cfg.active_index]
        own = widths.get(cfg.active_index, 0)
        active = Active(ActiveRole(method.build_active(cfg, n_classes, rand, own, own_extra).to(device), rand))
    batched = cfg.stack_parties == "always" or (cfg.stack_parties == "auto" and device.type == "cuda")
    models = {k: role.model for k, role in parties.items()}
    batched = batched and not cfg.privacy.enabled  # DP-SGD hooks each party's own networks
    stack = PartyStack(models) if method.stackable and batched and PartyStack.can_stack(models) else None
    return Node(cfg, parties, active, transport, device, stack, method, private_gradients(cfg, parties, randomness))


__all__ = ["METHODS", "EmbeddingFusion", "FalseVfl", "FalseVflMoments", "FedHssl", "Laser", "Method", "Objective",
           "Option", "PlugVfl", "Vanilla", "build_node", "make_config", "method_for", "method_labels", "method_named",
           "parse_method", "register"]
