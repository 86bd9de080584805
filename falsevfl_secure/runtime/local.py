"""The local runtime: every party and the active party in one process, plain in-process transport.

It is the fast path for accuracy experiments, and the plaintext reference that the distributed
and secure runtimes must reproduce.
"""

from __future__ import annotations

import logging

import torch

from ..config import Config
from ..data import TEST_PATTERNS, load_dataset, make_test_split, make_train_split
from ..train import Stopwatch, evaluate, host_split, run_training
from ..transport import LocalTransport
from ..world import make_world, resolve_device

log = logging.getLogger(__name__)


def make_splits(cfg: Config, test_patterns: tuple[str, ...] = TEST_PATTERNS):
    """The dataset, its training split under cfg.train_mechanism and one test split per pattern."""
    dataset = load_dataset(cfg.dataset, seed=cfg.seed)
    train = make_train_split(dataset, cfg.parties, cfg.train_mechanism, cfg.seed, cfg.n_labeled, cfg.n_aligned)
    tests = {p: make_test_split(dataset, cfg.parties, p, cfg.seed) for p in test_patterns}
    return dataset, train, tests


def run_local(cfg: Config, test_patterns: tuple[str, ...] = TEST_PATTERNS, progress: bool = True,
              checkpoint_dir=None, resume: bool = False, after_epoch=None) -> dict:
    """Train both stages and evaluate every test pattern; returns the result record. With
    `checkpoint_dir`, every party's state is saved after each epoch and `resume` continues from it."""
    clock = Stopwatch()
    cfg.validate()
    device = resolve_device(cfg.device)
    dataset, train_split, tests = make_splits(cfg, test_patterns)
    widths = {k: block.shape[1] for k, block in enumerate(train_split.blocks)}
    world = make_world(cfg, widths, dataset.n_classes, LocalTransport(cfg.parties, cfg.active), device)
    hosted = range(cfg.parties)
    train_data = host_split(train_split, hosted, True, device, dataset.n_classes)

    stage_seconds: dict = {}
    stage1, stage2 = run_training(world, train_data, checkpoint_dir, resume, progress, after_epoch=after_epoch,
                                  seconds=stage_seconds)
    eval_start = clock()
    accuracy = {}
    for pattern, split in tests.items():
        accuracy[pattern] = evaluate(world, host_split(split, hosted, True, device, dataset.n_classes))
    return {
        "accuracy": accuracy,
        "wall_time_s": round(clock(), 3),
        "stage_time_s": {**stage_seconds, "evaluate": round(clock() - eval_start, 3)},
        "protocol": "plain",
        "runtime": "local",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "losses": {"pretrain": stage1, "train": stage2},
        "samples": {"train": train_split.n, "labeled": int(train_split.labeled.sum()),
                    "test": {p: s.n for p, s in tests.items()}},
        "dropped_no_observed_party": {"train": train_split.dropped, **{p: s.dropped for p, s in tests.items()}},
        "communication": world.transport.log.table(),
        "_world": world,
    }
