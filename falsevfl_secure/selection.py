"""Stage 2 keeps its best epoch: the discriminator that scores best on the held-out validation records.

In stage 2 the generative part is frozen, so the forward rounds of the validation records give the same
distribution at every epoch: they run once, when the stage starts (every party takes part, as in a
prediction), and the active party keeps the log weights and latent samples. After each epoch it scores
its discriminator on them (log loss, or RMSE in standardised units for regression) and keeps the best
epoch's weights; at the end of the stage it restores them. Only the discriminator changes in stage 2 and
it lives at the active party, so the choice is the active party's own: nothing about it crosses, and the
passive parties run the same public schedule whatever it decides.

With `head = "network+trees"` the active party then fits gradient-boosted trees (model/trees.py) on the
labeled training records' posterior means and its own block: one more pass of their forward rounds, as
in a prediction (every party takes part), and chooses the trees' share of the blend on the validation
records, its own choice as well.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from .config import Stage
from .methods.false_vfl_steps import forward_rounds, own_groups, own_inputs, snis_output, trees_inputs
from .metrics import selection_loss, selection_metric
from .model.trees import TreesHead, categorical_mask
from .node import HostedData, Node
from .passes import each_batch


@torch.no_grad()
def forward_once(node: Node, data: HostedData, rows: np.ndarray | None = None, trees_only: bool = False,
                 where: tuple[int, int] = (int(Stage.TRAIN), 0)) -> list:
    """Collective: the forward rounds of `rows` (default: all) in evaluation batches, as in a prediction;
    per batch what the active party keeps: the weights and samples, its discriminator's own inputs and its
    trees' inputs (`trees_only`: these alone, without the S samples per row a large table cannot hold). A party
    lost meanwhile is left out (`passes.each_batch`; `where`: the (stage, epoch) its announcement names)."""
    rows = np.arange(data.n) if rows is None else np.asarray(rows)
    node.restart_noise(Stage.PREDICT)

    def run(batch):
        weighted = forward_rounds(node, batch, node.cfg.predict_samples, Stage.PREDICT)
        trees = trees_inputs(node, batch, weighted) if node.method.fits_trees else None
        return trees if trees_only else (weighted, own_inputs(node, batch, weighted), trees)

    return each_batch(node, data, rows, run, where)


class BestEpoch:
    """The validation score of every stage-2 epoch and the weights of the best one (at the active party)."""

    def __init__(self, node: Node, validation: HostedData) -> None:
        self.node, self.scores, self.best_epoch = node, [], None
        self.best_score, self._best_state = math.inf, None
        self._cached = forward_once(node, validation)  # collective: every party runs these rounds
        self.y = validation.y.get() if node.active.present else None

    @torch.no_grad()
    def score(self) -> float:
        """Log loss (classification) or RMSE (regression) of the current discriminator, at the active party."""
        role = self.node.active.get()
        out = torch.cat([snis_output(role, w.get(), own) for w, own, _ in self._cached])
        return selection_loss(role.model.task, out, self.y, role.class_weights)

    def update(self, epoch: int) -> None:
        """After a stage-2 epoch: score it and keep its weights when it is the best so far."""
        if not self.node.active.present or not self._cached:
            return
        value = self.score()
        self.scores.append(round(value, 6))
        if value < self.best_score:
            self.best_score, self.best_epoch = value, epoch
            self._best_state = copy.deepcopy(self.node.active.get().model.discriminator.state_dict())

    def state(self) -> dict:
        """What the active party's checkpoint keeps of the choice, so that a resumed stage 2 chooses among every
        epoch (review finding: it chose among those after the resume, or kept the last epoch)."""
        return {"scores": list(self.scores), "best_score": self.best_score, "best_epoch": self.best_epoch,
                "best": self._best_state}

    def load(self, state: dict | None) -> None:
        if state:
            self.scores, self.best_score = list(state["scores"]), float(state["best_score"])
            self.best_epoch, self._best_state = state["best_epoch"], state["best"]

    def restore(self) -> dict | None:
        """Load the best epoch's discriminator; what was chosen (None where this process has no label side)."""
        if self._best_state is None:
            return None
        self.node.active.get().model.discriminator.load_state_dict(self._best_state)
        metric = selection_metric(self.node.cfg.task, self.node.active.get().class_weights is not None)
        # epochs counted from 1, as the plot and the printed lines count them (a trial read 9 here, 10 in the plot)
        return {"metric": metric, "best_epoch": self.best_epoch + 1, "best": round(self.best_score, 6),
                "per_epoch": self.scores}


@torch.no_grad()
def fit_trees(node: Node, data: HostedData, validation: HostedData | None, best: BestEpoch | None,
              selects: bool) -> dict | None:
    """`head = "network+trees"`, after stage 2 (collective): the labeled training records' forward rounds once,
    the active party's trees fitted on them, their share of the blend chosen on the validation records (the
    rounds `best` kept where stage 2 `selects`, else one pass of them). What was fitted (None where this
    process has no label side)."""
    rows = node.method.rows(Stage.TRAIN, data)
    after = (int(Stage.TRAIN), node.cfg.train.epochs)  # what a loss during these passes is announced at
    training = forward_once(node, data, rows, trees_only=True, where=after)
    fresh = validation is not None and validation.n and not selects  # the same decision at every party
    checked = forward_once(node, validation, where=after) if fresh else best._cached if best is not None else None
    if not node.active.present:
        return None
    role, cfg = node.active.get(), node.cfg
    features = np.concatenate([t.get() for t in training])
    head = TreesHead(cfg.task, role.model.n_classes, cfg.seed, categorical_mask(own_groups(node), features.shape[1]),
                     balanced=role.class_weights is not None)
    head.fit(features, data.y.get()[rows].cpu().numpy(), node.transport.working)
    if checked:
        network = torch.cat([snis_output(role, w.get(), own) for w, own, _ in checked])
        head.choose(network, np.concatenate([t.get() for _, _, t in checked]), validation.y.get(), role.class_weights)
    role.trees = head
    return head.record()
