"""Stage 2 on one pass of its rounds (FALSE-VFL's `stage2_pass = "once"`).

In stage 2 the generative part is frozen, so a row's forward rounds only ever draw new latent samples: the
pass runs once, when the stage starts (every party takes part), and the active party keeps each stage-2
row's log weights, samples, posterior mean and its own inputs. Every epoch then trains the discriminator on
them at the active party alone: no round, so no party waits, and under a privacy budget each row is released
in stage 2 twice in all instead of twice per epoch (`privacy.releases_per_row`). The price: each row keeps
the kappa samples of that one pass for every epoch, where the paper draws new ones each epoch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .config import Stage
from .methods.false_vfl_steps import Weighted, conditional_loss, forward_rounds, own_inputs
from .node import HostedData, Node
from .passes import each_batch
from .placement import Active


class Stage2Cache:
    """At the active party: what the one pass of stage 2's rounds left for each of its rows."""

    def __init__(self, node: Node, data: HostedData) -> None:
        self.node, rows = node, np.asarray(node.method.rows(Stage.TRAIN, data))
        self.position = np.full(data.n, -1, dtype=np.int64)
        self.position[rows] = np.arange(len(rows))
        parts = _forward_pass(node, data, rows)  # collective: every party runs these rounds
        if node.active.present and parts:
            self.log_w, self.h, self.loc = (torch.cat([getattr(p[0], f) for p in parts], dim) for f, dim in
                                            (("log_w", 1), ("h", 1), ("loc", 0)))
            self.own = None if parts[0][1] is None else torch.cat([p[1] for p in parts])
            self.y, self.n_observed = (torch.cat([p[i] for p in parts]) for i in (2, 3))

    def loss(self, rows: np.ndarray) -> Tensor:
        """The negative conditional bound of the batch `rows` (data rows of stage 2), from the kept values."""
        at = torch.from_numpy(self.position[rows])
        weighted = Weighted(self.log_w[:, at], self.h[:, at], self.loc[at])
        own = None if self.own is None else self.own[at]
        return conditional_loss(self.node.active.get(), weighted, self.y[at], own, self.n_observed[at])


@torch.no_grad()
def _forward_pass(node: Node, data: HostedData, rows: np.ndarray) -> list[tuple]:
    """The forward rounds of stage 2 over `rows` in evaluation batches; per batch, at the active party, the
    weights and samples, its own inputs, the labels and the holders per row."""

    def run(batch):
        weighted = forward_rounds(node, batch, node.cfg.kappa, Stage.TRAIN)
        if node.active.present:
            return weighted.get(), own_inputs(node, batch, weighted), batch.y.get(), batch.n_observed.get()
        return None

    return [p for p in each_batch(node, data, rows, run, (int(Stage.TRAIN), 0)) if p is not None]


def cached_epoch(node: Node, data: HostedData, cache: Stage2Cache, epoch: int, optimizers: dict) -> list:
    """One stage-2 epoch from the cache at the active party (the public plan's batches): (loss, rows) each;
    nothing at a process without the label side."""
    if not node.active.present:
        return []
    settings, losses = node.cfg.train, []
    plan = node.method.plan(Stage.TRAIN, data, epoch, node.cfg.seed, settings.batch_size)
    for rows in plan[:settings.steps_per_epoch] if settings.steps_per_epoch else plan:
        for opt in optimizers.values():
            opt.zero_grad(set_to_none=True)
        loss = cache.loss(rows)
        loss.backward()
        for opt in optimizers.values():
            opt.step()
        losses.append((Active(loss.detach()), len(rows)))
    node.transport.working()  # the parties waiting for the next pass see the epoch done
    return losses
