"""The labeled/unlabeled training split and the vertical (per-party) views of train and test data.

Training split (paper, "Setup"): `n_labeled` samples are drawn uniformly at random from the
training set; the first `n_aligned` of them are fully observed (the "aligned reserve", which the
aligned-only baselines need); every other sample, labeled or not, follows the training mechanism.
Labels of unlabeled samples stay in `y` (useful for diagnostics), but `labeled` is False for them
and the trainer reads `y` only where `labeled` is True. Test split: every test sample follows the
test mechanism and is labeled.

Defaults (`n_labeled` / `n_aligned`): Isolet and HAPT 500 / 100, Fashion-MNIST 1000 / 200 (as in
the paper); digits 400 / 80: the demo dataset has no paper setting, and its training set has 1347 rows.

Empty-row rule. A sample whose mask has no observed party is held by no party, so in a real
federation it does not exist in anyone's database. It is REMOVED from the split (never passed to
the model as an all-zero row), `dropped` counts it, and the count is logged and reported in the
run's result record. The aligned reserve is never dropped (it is fully observed).

Privacy of the views: in `blocks[k]` the rows that party k does not hold are set to 0.0, so no
party's array ever contains values it does not have; `party_block(k)` returns only (x_k, held_k).

Missing cells (`cell_missing` > 0, simulations only). Inside the blocks a party holds, each cell is
removed independently with that probability (one public uniform draw per cell, from its own stream, so the
cells removed at 10 % are among those removed at 30 %, and the draw does not depend on the mechanism).
A removed cell is 0.0 in the block and False in `observed`. A block that loses every cell is a missing
block (the party does not hold the row) and the empty-row rule applies after it; in the aligned reserve
such a block keeps its cells, so the reserve stays held by every party.

Seeding: every random stream comes from `np.random.SeedSequence([seed, stream, ...])`, so the same
seed gives identical splits, the labeled draw does not depend on the mechanism, and each test
pattern's mask is drawn from its own stream, independent of the training split.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..randomness import PublicStream, public_rng
from .errors import DataError
from .loaders import DEFAULT_LABELED, TABULAR_DEFAULT, Dataset, load_dataset
from .mechanisms import MECHANISM_ROWS, Dirichlet, Mechanism, parse_mechanism
from .partition import feature_blocks, split_blocks

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)

TEST_PATTERNS: tuple[str, ...] = ("mcar:0", "mcar:0.2", "mcar:0.5", "mar1", "mar2", "mnar:0.7", "mnar:0.9")
TRAIN_MECHANISMS: tuple[str, ...] = ("mcar:0.2", "mcar:0.5", "mar1", "mar2", "mnar:0.7", "mnar:0.9")


@dataclass(frozen=True)
class LabelSide:
    """What only the active party holds of a split: how many parties hold each row, and the labels."""

    n_observed: np.ndarray  # int64 (N,)
    y: np.ndarray  # (N,): class indices, or float targets for regression


@dataclass(frozen=True)
class PartyView:
    """What one process holds of a split: its parties' blocks and held rows, and, at the active party,
    the label side. `labeled_index` (row numbers of the labeled rows, not the labels) is public: the
    active party announces it before stage 2 so every party knows which rows to encode.

    `observed` (optional): party -> (N, d_k) bool, True where a cell of a held row has a value; a party
    without an entry (or `observed=None`) observes every cell of the rows it holds. Values at unobserved
    cells are ignored (mean-imputed). A held row must have at least one observed cell: a block with
    every cell empty is a block the party does not hold.

    `record_keys` (optional): (N, 32) uint8, per row a keyed hash of the record's ID
    (`randomness.record_keys`), never the ID. Given, predictions are repeatable: the active party draws
    each row's sampling noise from its own secret and the row's key (every row needs one there), and a
    party's FALSE-VFL-II imputation noise is one secret draw shared by all rows (a passive party's keys
    are not used; their presence switches it to that rule). None (simulations): noise as in training,
    one stream per role restarted for the prediction.

    `patterns` (optional, public): (N, K) bool, which parties hold each row. A simulation's split follows
    from the public seed, so its patterns are public and every party gets them (the baselines that train on
    the rows every party holds, or group rows by their observed set, need them); None elsewhere (a
    federation: only the active party knows who holds a record)."""

    n: int
    blocks: dict[int, tuple[np.ndarray, np.ndarray]]  # party -> (features (N, d_k), held rows (N,))
    labels: LabelSide | None
    labeled_index: np.ndarray
    dropped: int = 0
    observed: dict[int, np.ndarray] | None = None
    record_keys: np.ndarray | None = None
    patterns: np.ndarray | None = None


@dataclass
class VerticalSplit:
    """Per-party views of one set of samples after the mechanism and the empty-row rule."""

    blocks: list[np.ndarray]
    missing: np.ndarray
    y: np.ndarray
    labeled: np.ndarray
    index: np.ndarray
    dropped: int
    mechanism: str
    aligned: np.ndarray | None = None  # bool (N,): the fully observed reserve (train split only)
    party_rates: np.ndarray | None = None  # the drawn per-party rates of a `dirichlet:` mechanism
    observed: list[np.ndarray] | None = None  # per party (N, d_k) bool: cells with a value (None: all)

    @property
    def n(self) -> int:
        return int(len(self.y))

    @property
    def parties(self) -> int:
        return len(self.blocks)

    def party_block(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """What party k may hold: its feature block (zeros where not held) and its held-rows mask."""
        if not 0 <= k < self.parties:
            raise DataError(f"party {k} does not exist; parties are 0..{self.parties - 1}")
        return self.blocks[k], ~self.missing[:, k]

    def view(self, parties: Iterable[int], with_labels: bool) -> PartyView:
        """What a process hosting `parties` may hold; the label side only `with_labels` (the active party)."""
        labels = None
        if with_labels:
            labels = LabelSide((~self.missing).sum(axis=1).astype(np.int64), np.asarray(self.y))
        blocks = {k: self.party_block(k) for k in parties}
        observed = None if self.observed is None else {k: self.observed[k] for k in blocks}
        return PartyView(self.n, blocks, labels, np.flatnonzero(self.labeled), self.dropped, observed,
                         patterns=~self.missing)


def _spec_stream(mechanism: Mechanism) -> int:
    return zlib.crc32(mechanism.spec.encode())


def _draw(mechanism: Mechanism, blocks: list[np.ndarray], rng: np.random.Generator
          ) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(mechanism, Dirichlet):
        missing, rates = mechanism.sample(blocks, rng, return_rates=True)
        return missing, rates
    return mechanism.sample(blocks, rng), None


def _assemble(blocks: list[np.ndarray], missing: np.ndarray, y: np.ndarray, labeled: np.ndarray,
              aligned: np.ndarray, mechanism: str, rates: np.ndarray | None, what: str,
              observed: list[np.ndarray] | None = None) -> VerticalSplit:
    """Apply the empty-row rule and zero every value a party does not hold (rows and cells)."""
    empty = missing.all(axis=1)
    if (empty & aligned).any():  # cannot happen: the reserve is fully observed
        raise AssertionError("aligned reserve rows would be dropped")
    keep = ~empty
    dropped = int(empty.sum())
    if dropped:
        log.info("%s split under %s: dropped %d of %d samples with no observed party (empty-row rule)",
                 what, mechanism, dropped, len(keep))
    missing = missing[keep]
    out, cells = [], None if observed is None else [np.ascontiguousarray(o[keep]) for o in observed]
    for k, block in enumerate(blocks):
        part = np.ascontiguousarray(block[keep], dtype=np.float32)
        part[missing[:, k]] = 0.0
        if cells is not None:
            cells[k][missing[:, k]] = False
            part[~cells[k]] = 0.0
        out.append(part)
    return VerticalSplit(out, missing, np.ascontiguousarray(y[keep], dtype=np.int64), labeled[keep].copy(),
                         np.flatnonzero(keep).astype(np.int64), dropped, mechanism, aligned[keep].copy(),
                         rates, cells)


def remove_cells(blocks: list[np.ndarray], missing: np.ndarray, aligned: np.ndarray, rate: float,
                 rng: np.random.Generator) -> tuple[list[np.ndarray] | None, np.ndarray]:
    """The observed-cell masks after removing each cell with probability `rate` (one uniform per cell
    of every block, in party order), and the block mask with the blocks that lost every cell marked
    missing; in the aligned reserve such a block keeps its cells. `rate` 0: (None, missing), no draw."""
    if not 0 <= rate < 1:
        raise DataError(f"cell_missing={rate}: the fraction of cells removed must lie in [0, 1)")
    if rate == 0:
        return None, missing
    missing, observed = missing.copy(), []
    for k, block in enumerate(blocks):
        cells = rng.random(block.shape) >= rate
        emptied = ~cells.any(axis=1)
        cells[emptied & aligned] = True
        missing[:, k] |= emptied & ~aligned
        observed.append(cells)
    return observed, missing


def make_train_split(dataset: Dataset, parties: int, mechanism: str, seed: int,
                     n_labeled: int | None = None, n_aligned: int | None = None,
                     cell_missing: float = 0.0, mechanism_rows: str = "all") -> VerticalSplit:
    """The training split: labeled draw, aligned reserve, training mechanism, missing cells, empty-row rule.
    `mechanism_rows`: the rows the mechanism removes blocks from, "all" (every training row outside the aligned
    reserve) or "labeled" (the labeled rows only: every unlabeled row stays fully observed)."""
    mech = parse_mechanism(mechanism)
    n = len(dataset.y_train)
    default_labeled, default_aligned = DEFAULT_LABELED.get(dataset.name, TABULAR_DEFAULT)
    n_labeled = default_labeled if n_labeled is None else int(n_labeled)
    n_aligned = default_aligned if n_aligned is None else int(n_aligned)
    if not 0 <= n_labeled <= n:
        raise DataError(f"n_labeled={n_labeled} must lie in 0..{n} (the {dataset.name} training set size)")
    if not 0 <= n_aligned <= n_labeled:
        raise DataError(f"n_aligned={n_aligned} must lie in 0..n_labeled={n_labeled}")
    if mechanism_rows not in MECHANISM_ROWS:
        raise DataError(f"mechanism_rows={mechanism_rows!r}: choose {' or '.join(MECHANISM_ROWS)}")
    blocks = split_blocks(dataset.x_train, feature_blocks(dataset, parties))
    chosen = public_rng(seed, PublicStream.SPLIT_LABELED).permutation(n)[:n_labeled]
    labeled = np.zeros(n, dtype=bool)
    labeled[chosen] = True
    aligned = np.zeros(n, dtype=bool)
    aligned[chosen[:n_aligned]] = True
    missing, rates = _draw(mech, blocks, public_rng(seed, PublicStream.SPLIT_TRAIN_MASK, _spec_stream(mech)))
    missing = np.asarray(missing, dtype=bool)
    missing[aligned] = False
    if mechanism_rows == "labeled":
        missing[~labeled] = False  # the same draws as "all" on the labeled rows
    cells = public_rng(seed, PublicStream.SPLIT_CELLS, 0)
    observed, missing = remove_cells(blocks, missing, aligned, cell_missing, cells)
    return _assemble(blocks, missing, np.asarray(dataset.y_train), labeled, aligned, mech.spec, rates,
                     "train", observed)


def make_test_split(dataset: Dataset, parties: int, mechanism: str, seed: int,
                    cell_missing: float = 0.0) -> VerticalSplit:
    """The test split: every test sample follows `mechanism`, all labeled; missing cells (the same
    cells for every mechanism) and the empty-row rule applied."""
    mech = parse_mechanism(mechanism)
    n = len(dataset.y_test)
    blocks = split_blocks(dataset.x_test, feature_blocks(dataset, parties))
    missing, rates = _draw(mech, blocks, public_rng(seed, PublicStream.SPLIT_TEST_MASK, _spec_stream(mech)))
    none = np.zeros(n, dtype=bool)
    observed, missing = remove_cells(blocks, np.asarray(missing, dtype=bool), none, cell_missing,
                                     public_rng(seed, PublicStream.SPLIT_CELLS, 1))
    return _assemble(blocks, missing, np.asarray(dataset.y_test), np.ones(n, dtype=bool), none, mech.spec,
                     rates, "test", observed)


def make_splits(cfg: Config, test_patterns: Iterable[str]) -> tuple[Dataset, VerticalSplit, dict[str, VerticalSplit]]:
    """The simulated federation of a run: the dataset, its training split under cfg.train_mechanism and one
    test split per pattern (all public: they follow from cfg.seed)."""
    dataset = load_dataset(cfg.dataset, seed=cfg.seed, standardize=cfg.standardize)
    n_labeled, n_aligned = cfg.n_labeled, cfg.n_aligned
    if cfg.max_rows is not None:
        dataset, n_labeled, n_aligned = subsample(dataset, cfg.max_rows, cfg.seed, n_labeled, n_aligned)
    train = make_train_split(dataset, cfg.parties, cfg.train_mechanism, cfg.seed, n_labeled, n_aligned,
                             cfg.cell_missing, cfg.mechanism_rows)
    tests = {p: make_test_split(dataset, cfg.parties, p, cfg.seed, cfg.cell_missing) for p in test_patterns}
    if cfg.privacy.enabled and cfg.standardize != "none":  # each party encodes its raw block privately
        raw = load_dataset(cfg.dataset, seed=cfg.seed, standardize="none")
        if cfg.max_rows is not None:
            raw = subsample(raw, cfg.max_rows, cfg.seed, n_labeled, n_aligned)[0]
        blocks = feature_blocks(raw, cfg.parties)
        train = with_values(train, raw.x_train, blocks)
        tests = {p: with_values(s, raw.x_test, blocks) for p, s in tests.items()}
    return dataset, train, tests


def with_values(split: VerticalSplit, x: np.ndarray, blocks: list[np.ndarray]) -> VerticalSplit:
    """The split with its blocks' values taken from `x` (the same rows and features as the data it was drawn
    from, treated otherwise: under a privacy budget the raw values, which each party standardises with DP);
    cells and blocks the split removed stay 0."""
    from dataclasses import replace

    values = split_blocks(np.asarray(x)[split.index], blocks)
    for k, part in enumerate(values):
        part[split.missing[:, k]] = 0.0
        if split.observed is not None:
            part[~split.observed[k]] = 0.0
    return replace(split, blocks=values)


def subsample(dataset: Dataset, rows: int, seed: int, n_labeled: int | None,
              n_aligned: int | None) -> tuple[Dataset, int, int]:
    """At most `rows` training and `rows` test rows (a public draw), for smoke tests of a configuration;
    the labeled and aligned counts shrink with the training set when they would not fit."""
    from dataclasses import replace

    rng = public_rng(seed, PublicStream.SUBSAMPLE)
    keep_train = np.sort(rng.permutation(len(dataset.y_train))[:rows])
    keep_test = np.sort(rng.permutation(len(dataset.y_test))[:rows])
    small = replace(dataset, x_train=dataset.x_train[keep_train], y_train=dataset.y_train[keep_train],
                    x_test=dataset.x_test[keep_test], y_test=dataset.y_test[keep_test])
    default_labeled, default_aligned = DEFAULT_LABELED.get(dataset.name, TABULAR_DEFAULT)
    labeled = min(default_labeled if n_labeled is None else n_labeled, len(keep_train) // 2)
    return small, labeled, min(default_aligned if n_aligned is None else n_aligned, labeled // 5)
