"""One host per party, over real interfaces: a three-party federation where every party runs in its own Linux
network namespace (`--party NAME`, its own address and veth interface), trains under mpc and predicts."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
from netns import available, hosts

from falsevfl_secure.data.synthetic import synthetic_split

PARTIES = ("bank", "insurer", "clinic")  # the clinic holds the labels


def write_tables(folder: Path, which: str, n: int, seed: int) -> None:
    """Each party's own CSV: its rows (a random subset), string IDs, its own row order."""
    split = synthetic_split(n=n, parties=3, width=4, p_missing=0.3, seed=seed)
    rng = np.random.default_rng(seed)
    ids = [f"{which}-{i:05d}" for i in range(n)]
    for k, name in enumerate(PARTIES):
        rows = np.flatnonzero(~split.missing[:, k]) if k < 2 else np.arange(n)
        rows = rows[rng.permutation(rows.size)]
        header = ["id", *(f"{name}_{j}" for j in range(4)), *(["label"] if k == 2 else [])]
        lines = [header]
        for i in rows:
            features = [f"{v:.6g}" for v in split.blocks[k][i]] if not split.missing[i, k] else [""] * 4
            lines.append([ids[i], *features, *([str(split.y[i])] if k == 2 else [])])
        (folder / name).mkdir(parents=True, exist_ok=True)
        with open(folder / name / f"{which}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows(lines)


def federation_file(folder: Path, machines) -> Path:
    parties = "".join(f'\n[[party]]\nname = "{name}"\ntrain = "{name}/train.csv"\npredict = "{name}/predict.csv"\n'
                      f'model = "{name}/model"\ninterface = "{host.interface}"\n'
                      for name, host in zip(PARTIES, machines, strict=True))
    text = (f'[federation]\nactive = "clinic"\nprotocol = "mpc"\nid_column = "id"\nlabel_column = "label"\n'
            f'rendezvous = "{machines[2].address}:29611"\n\n[model]\npreset = "digits:quick"\nkappa = 4\n'
            f'[model.pretrain]\nepochs = 3\nbatch_size = 64\n[model.train]\nepochs = 10\n{parties}')
    (folder / "federation.toml").write_text(text)
    return folder / "federation.toml"


def run_everywhere(machines, argv: list[str], timeout: float = 240) -> None:
    """`python -m falsevfl_secure.federation ARGV --party NAME` on every host at once."""
    procs = [host.popen([sys.executable, "-m", "falsevfl_secure.federation", *argv, "--party", name, "--quiet"],
                        env=host.env(TORCH_CPP_LOG_LEVEL="ERROR"), stdout=-1, stderr=-1, text=True)
             for name, host in zip(PARTIES, machines, strict=True)]
    outputs = [p.communicate(timeout=timeout) for p in procs]
    for name, p, (_, err) in zip(PARTIES, procs, outputs, strict=True):
        assert p.returncode == 0, f"{name}: {err[-2000:]}"


def test_a_three_party_federation_with_one_network_namespace_per_party(tmp_path):
    ok, reason = available()
    if not ok:
        pytest.skip(reason)
    write_tables(tmp_path, "train", 240, seed=1)
    write_tables(tmp_path, "predict", 80, seed=2)
    with hosts(3) as machines:
        config = str(federation_file(tmp_path, machines))
        run_everywhere(machines, ["train", "--config", config])
        run_everywhere(machines, ["predict", "--config", config, "--out", str(tmp_path / "predictions.csv")])
    with open(tmp_path / "predictions.csv", newline="") as handle:
        predictions = list(csv.DictReader(handle))
    assert len(predictions) == 80 and {r["parties_observed"] for r in predictions} <= {"1", "2", "3"}
    assert list(predictions[0]) == ["id", "prediction", "parties_observed", "p_0", "p_1", "p_2"]
    for name in PARTIES:
        assert (tmp_path / name / "model" / "manifest.json").is_file()
