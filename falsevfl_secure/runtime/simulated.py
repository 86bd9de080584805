"""What each role of a simulated federation holds, and the result record both runtimes report.

A simulation draws one public split from the seed (`data.make_splits`); a role then keeps only what its
parties may hold (their blocks and held rows; the label side at the active party) and drops the rest
before any model exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..config import Config
from ..data import PartyView, make_splits
from ..data.standardize import DEFAULT_CLIP
from ..randomness import RoleSecret
from .records import RunResult


@dataclass
class ActiveBlock:
    """The active party's block of one split, as its own reference model reads it (reference.py)."""

    x: np.ndarray
    observed: np.ndarray
    held: np.ndarray

    @classmethod
    def of(cls, view: PartyView, a: int) -> ActiveBlock:
        x, held = view.blocks[a]
        observed = (view.observed or {}).get(a)
        return cls(x, np.ones(x.shape, bool) if observed is None else observed, held)


def own_reference(cfg: Config, role: SimulatedRole) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """With `own_reference`: the active party's own models' scores of its training rows (out of fold on the
    labeled ones) and of every test split's rows (the models fitted on all labeled rows); None otherwise."""
    from ..methods import method_for
    from ..reference import own_scores

    method = method_for(cfg)
    if not method.reads_own_reference:
        return None
    a, patterns = cfg.active_index, list(role.tests)
    train, scores = own_scores(ActiveBlock.of(role.train, a), role.train.labels.y, role.train.labeled_index,
                               cfg.task, role.n_classes, cfg.seed, tuple(ActiveBlock.of(role.tests[p], a)
                                                                         for p in patterns),
                               kinds=method.own_reference_kinds)
    return train, dict(zip(patterns, scores, strict=True))


@dataclass
class SimulatedRole:
    train: PartyView
    tests: dict[str, PartyView]
    widths: dict[int, int]
    n_classes: int | None  # at the active party only
    dropped: dict[str, int]


def simulated_role(cfg: Config, patterns: Iterable[str], parties: Iterable[int], with_labels: bool,
                   secrets: Mapping[int, RoleSecret] | None = None) -> SimulatedRole:
    """The views of the training split and of every test split that a process hosting `parties` may hold; under
    a privacy budget each party's block standardised with DP from its own secret (`secrets`: tests')."""
    parties = list(parties)
    dataset, train, tests = make_splits(cfg, tuple(patterns))
    train_view = train.view(parties, with_labels)
    test_views = {p: s.view(parties, with_labels) for p, s in tests.items()}
    if cfg.privacy.enabled and cfg.standardize != "none":
        for k in parties:
            private_standardize(cfg, k, train_view, list(test_views.values()),
                                (secrets[k] if secrets else RoleSecret.fresh()).stream("encoding"))
    return SimulatedRole(train=train_view, tests=test_views,
                         widths={k: train.blocks[k].shape[1] for k in parties},
                         n_classes=dataset.n_classes if with_labels else None,
                         dropped={"train": train.dropped, **{p: s.dropped for p, s in tests.items()}})


def private_standardize(cfg: Config, k: int, train: PartyView, tests: list[PartyView], stream) -> None:
    """Party k's block of every view standardised by statistics released with DP from its training rows
    (data/private_encoding.py, at `privacy.encoding_multiplier`; "zscore" too is floored and clipped then, since
    noise can take a variance to 0), in place; cells it does not hold stay 0."""
    from ..data.private_encoding import private_scaler
    from ..privacy import encoding_multiplier

    x, held = train.blocks[k]
    observed = (train.observed or {}).get(k)
    observed = np.ones(x.shape, bool) if observed is None else observed
    scaler = private_scaler(x[held], observed[held], encoding_multiplier(cfg.privacy), stream, clip=DEFAULT_CLIP)
    for view in (train, *tests):
        block, rows = view.blocks[k]
        cells = (view.observed or {}).get(k)
        out = scaler.transform(block)
        out[~rows] = 0.0
        if cells is not None:
            out[~cells] = 0.0
        view.blocks[k] = (out, rows)


def observed_fraction(view: PartyView, parties: int) -> float:
    """The mean fraction of parties that hold a row of the split (known to the active party)."""
    return float(np.mean(view.labels.n_observed) / parties) if view.n else 0.0


def run_result(cfg: Config, role: SimulatedRole, accuracy: dict, fit, wall: float, evaluate_s: float,
               protocol: str, runtime: str, device: str, communication: list[dict], timed: bool) -> RunResult:
    """The result record of a run, from the active party's side."""
    return RunResult(
        accuracy=accuracy,
        observed_fraction={p: round(observed_fraction(v, cfg.parties), 4) for p, v in role.tests.items()},
        wall_time_s=round(wall, 3), stage_time_s={**fit.seconds, "evaluate": round(evaluate_s, 3)},
        protocol=protocol, runtime=runtime, device=device, losses=fit.losses,
        samples={"train": role.train.n, "labeled": len(role.train.labeled_index),
                 "test": {p: v.n for p, v in role.tests.items()}},
        dropped_no_observed_party=role.dropped, communication=_untimed(communication) if not timed else communication,
        timed=timed,
        config=cfg.to_dict(), stage_split=fit.split if timed else None)


def _untimed(rows: list[dict]) -> list[dict]:
    """The local runtime measures no time per round: no `seconds` or `waiting` rather than zeros."""
    return [{k: v for k, v in row.items() if k not in ("seconds", "waiting")} for row in rows]
