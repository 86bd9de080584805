"""Every protocol runs stage 1, stage 2 and evaluation on every dataset preset (quick schedule, one epoch
each, a public subsample of rows), and every sum the plaintext run produces lies far inside each secure
protocol's documented range."""

from __future__ import annotations

from dataclasses import replace

import pytest

from falsevfl_secure.data import DataError, load_dataset
from falsevfl_secure.methods import make_config
from falsevfl_secure.runtime.distributed import run_distributed
from falsevfl_secure.runtime.local import run_local
from falsevfl_secure.transport import PROTOCOLS

PATTERNS = ("mcar:0.2",)
MARGIN = 100.0  # the largest contribution must stay this far inside the range


def smoke(dataset: str):
    try:
        load_dataset(dataset)
    except DataError as error:
        pytest.skip(f"{dataset} is not on this machine: {error}")
    cfg = make_config(dataset, "quick", max_rows=200)
    return replace(cfg, pretrain=replace(cfg.pretrain, epochs=1), train=replace(cfg.train, epochs=1))


def peaks(rows: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in rows:
        out[row["round"]] = max(out.get(row["round"], 0.0), row.get("peak", 0.0))
    return out


@pytest.mark.parametrize("dataset", ["digits", "isolet", "fashion-mnist", "hapt"])
def test_every_protocol_trains_and_evaluates_every_dataset_preset(dataset, tmp_path):
    cfg = smoke(dataset)
    plain = run_local(cfg, PATTERNS, progress=False)
    largest = peaks(plain.communication)
    assert set(largest) >= {"posterior", "likelihood", "latent_grad"} and min(largest.values()) >= 0
    for name in ("mpc", "he"):
        limit = PROTOCOLS[name].addend_range(cfg.parties)
        assert all(value * MARGIN < limit for value in largest.values()), (name, limit, largest)
        result = run_distributed(cfg, name, PATTERNS, progress=False, out_dir=tmp_path / name)
        assert set(result.stage_time_s) == {"pretrain", "train", "evaluate"} and "mcar:0.2" in result.accuracy
        secure = peaks(result.communication)
        assert set(secure) == set(largest), (name, set(secure) ^ set(largest))  # the same sums, each measured
        assert all(value * MARGIN < limit for value in secure.values()), name
        print(f"{dataset} {name}: largest addend per round {largest}, range {limit:.3g} per party")
