"""What each role of a simulated federation holds, and the result record both runtimes report.

A simulation draws one public split from the seed (`data.make_splits`); a role then keeps only what its
parties may hold (their blocks and held rows; the label side at the active party) and drops the rest
before any model exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..config import Config
from ..data import PartyView, make_splits
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


def simulated_role(cfg: Config, patterns: Iterable[str], parties: Iterable[int], with_labels: bool) -> SimulatedRole:
    """The views of the training split and of every test split that a process hosting `parties` may hold."""
    parties = list(parties)
    dataset, train, tests = make_splits(cfg, tuple(patterns))
    return SimulatedRole(train=train.view(parties, with_labels),
                         tests={p: s.view(parties, with_labels) for p, s in tests.items()},
                         widths={k: train.blocks[k].shape[1] for k in parties},
                         n_classes=dataset.n_classes if with_labels else None,
                         dropped={"train": train.dropped, **{p: s.dropped for p, s in tests.items()}})


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
