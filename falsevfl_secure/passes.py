"""A collective forward pass over rows in evaluation batches (stage 2's one pass, the validation and trees passes)
that goes on without a party lost during it, where the run's policy says so (runtime/losses.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from .network.network import PartyLost
from .node import Batch, HostedData, Node

T = TypeVar("T")


def each_batch(node: Node, data: HostedData, rows: np.ndarray, run: Callable[[Batch], T],
               where: tuple[int, int]) -> list[T]:
    """`run(batch)` for each evaluation batch of `rows`, at every role alike. A party lost during one: every role
    runs that batch again without it (a pass keeps every row, where a training step is abandoned) and it holds no
    row from then on; `where` ((stage, epoch)) is what the loss's announcement names. While losses are tolerated
    the pass ends with the active party's word (`pass_done`): no role leaves it while a batch may still rerun."""
    handler = getattr(node.transport, "on_party_lost", None) if node.method.survives_party_loss else None
    size, out, index = node.cfg.eval_batch_size, {}, 0
    starts = range(0, len(rows), size)
    if handler is not None:
        data.set_dropped(handler.lost)  # a party lost before this pass holds none of its rows
        handler.begin(len(starts))
    while True:
        try:
            if index < len(starts):
                out[index] = run(data.batch(rows[starts[index]:starts[index] + size]))  # a rerun replaces it
                index += 1
                continue
            if handler is not None:
                handler.pass_done(where, len(starts))
            return [out[i] for i in range(len(starts))]
        except PartyLost as lost:
            if handler is None:
                raise
            node.transport.abandon()
            resumed = max(0, handler(lost, (*where, index - 1)))  # announced as resuming at this batch
            data.set_dropped(handler.lost)
            if resumed <= index:  # the batch in flight (or one it finished) runs again: its rows are released once
                handler.charge()  # more, counted first, even where this party's frame may have gone unsummed (red team:
            index = resumed  # a notice naming an earlier epoch let the active party sum batch 0 twice, uncounted)
