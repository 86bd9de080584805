"""The local runtime: every party and the active party in one process, plain in-process transport.

It is the fast path for accuracy experiments, and the plaintext reference that the distributed and
secure runtimes must reproduce.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from ..config import Config
from ..data import TEST_PATTERNS
from ..methods import build_node
from ..node import resolve_device
from ..placement import Active
from ..randomness import RoleSecret
from ..train import EpochHook, HostedData, evaluate, fit, host_split
from ..transport import LocalTransport
from .records import RunResult
from .simulated import own_reference, run_result, simulated_role


def run_local(cfg: Config, test_patterns: tuple[str, ...] = TEST_PATTERNS, progress: bool = True,
              checkpoint_dir=None, resume: bool = False, after_epoch: EpochHook | None = None,
              secrets: Mapping[int, RoleSecret] | None = None, keep: list | None = None) -> RunResult:
    """Train both stages and evaluate every test pattern. With `checkpoint_dir`, every party's state is
    saved after each epoch and `resume` continues from it. `secrets` (tests) fixes the parties' secrets;
    `keep`, when a list, receives the trained node and the role's views (as it trained and tested on them: under
    a privacy budget each party's block is standardised privately, unlike `make_splits`' blocks)."""
    start = time.perf_counter()
    cfg.validate()
    device = resolve_device(cfg.device)
    role = simulated_role(cfg, test_patterns, range(cfg.parties), with_labels=True, secrets=secrets)
    scores = own_reference(cfg, role)  # the active party's own trees, an input of its discriminator
    node = build_node(cfg, role.widths, role.n_classes, LocalTransport(cfg.parties, cfg.active_index), device, secrets,
                      own_extra=0 if scores is None else scores[0].shape[1])
    trained = fit(node, hosted(role.train, device, role.n_classes, scores and scores[0]), checkpoint_dir, resume,
                  progress, after_epoch=after_epoch)
    began = time.perf_counter()
    accuracy = {p: evaluate(node, hosted(v, device, role.n_classes, scores and scores[1][p])).get()
                for p, v in role.tests.items()}
    if keep is not None:
        keep.extend((node, role))
    return run_result(cfg, role, accuracy, trained, time.perf_counter() - start, time.perf_counter() - began,
                      "plain", "local", str(device), node.transport.log.table(), timed=False)


def hosted(view, device, n_classes: int, scores) -> HostedData:
    """A split as the node holds it, with the active party's own trees' score where it has one."""
    data = host_split(view, device, n_classes)
    if scores is not None:
        data.own_extra = Active(torch.from_numpy(scores).to(device))
    return data
