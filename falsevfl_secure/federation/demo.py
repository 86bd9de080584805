"""`federation demo`: per-party tables from a benchmark dataset, as separately held data would look.

The demo takes the simulation's split of the same dataset, party count and seed (`data.make_splits`),
and writes for each party the rows it holds under the training mechanism (the active party also every
labeled row, with empty features where it does not hold them), with string IDs, each party's rows in
its own shuffled order, and a separate prediction set under one test pattern, plus a
`federation.toml` and `truth.csv` (id, label of every prediction record). Training through the
federation therefore sees the same records, labels and mask as `simulate`, so their accuracies can be
compared (bench/federation_equivalence.py).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from ..data import VerticalSplit, make_splits
from ..data.loaders import DATASET_SPECS
from ..fsio import atomic_write
from ..methods import make_config
from ..randomness import PublicStream, public_rng


def label_name(dataset: str, y: int) -> str:
    names = DATASET_SPECS[dataset].label_names if dataset in DATASET_SPECS else None
    return names[y] if names else str(y)


def write_demo(dataset: str, parties: int, out: Path, seed: int = 0, protocol: str = "mpc",
               test_pattern: str = "mcar:0.2", preset: str = "default", validation_fraction: float = 0.0) -> Path:
    """Write the demo federation to `out`; returns the path of its federation.toml."""
    cfg = make_config(dataset, preset, parties=parties, seed=seed)
    data, train, tests = make_splits(cfg, (test_pattern,))
    rng = public_rng(seed, PublicStream.DEMO_TABLES)
    train_ids, test_ids = _ids(rng, train.n, "r"), _ids(rng, tests[test_pattern].n, "q")
    names = [f"party{k}" for k in range(parties)]
    active = cfg.active_index
    test = tests[test_pattern]

    def label(i: int) -> str:
        return label_name(cfg.dataset, int(train.y[i])) if train.labeled[i] else ""

    for k, name in enumerate(names):
        is_active = k == active
        _write_table(out / name / "train.csv", train, k, train_ids, rng, label if is_active else None,
                     with_unheld=train.labeled if is_active else None)
        _write_table(out / name / "predict.csv", test, k, test_ids, rng, None,
                     with_unheld=np.ones(test.n, dtype=bool) if is_active else None)
    truth = [("id", "label")] + [(test_ids[i], label_name(cfg.dataset, int(y))) for i, y in enumerate(test.y)]
    atomic_write(out / "truth.csv", _csv(truth))
    pins = write_identities(out, names)
    path = out / "federation.toml"
    atomic_write(path, _toml(cfg.dataset if preset == "default" else f"{cfg.dataset}:{preset}", names, names[active],
                             protocol, seed, pins, validation_fraction))
    return path


def write_identities(out: Path, names: list[str]) -> dict[str, str]:
    """An identity key per party and for the aggregator, where `keygen` puts them (keys/<name>.key beside
    the file); the pins. In a real federation each participant runs `federation keygen` on its own host and
    sends only the printed pin."""
    from ..secure import identity
    from .config import KEYS_FOLDER

    pins = {}
    for name in [*names, "aggregator"]:
        key = identity.generate()
        path = out / KEYS_FOLDER / f"{name}.key"
        path.unlink(missing_ok=True)  # the demo rewrites its own folder
        identity.write_private_key(path, key)
        pins[name] = identity.pin_text(identity.public_bytes(key))
    return pins


def _ids(rng: np.random.Generator, n: int, prefix: str) -> list[str]:
    """Distinct string IDs in no meaningful order (public: they are made up)."""
    numbers = rng.choice(16**8, size=n, replace=False)
    return [f"{prefix}{v:08x}" for v in numbers]


def _write_table(path: Path, split: VerticalSplit, party: int, ids: list[str], rng: np.random.Generator,
                 label, with_unheld: np.ndarray | None) -> None:
    """The rows party `party` holds (plus `with_unheld` rows, with empty features) in a shuffled order."""
    block, held = split.party_block(party)
    rows = np.flatnonzero(held | (with_unheld if with_unheld is not None else False))
    header = ["id", *(f"p{party}_x{j}" for j in range(block.shape[1])), *(["label"] if label else [])]
    lines = [header]
    for i in rows[rng.permutation(rows.size)]:
        features = [f"{v:.7g}" for v in block[i]] if held[i] else [""] * block.shape[1]
        lines.append([ids[i], *features, *([label(i)] if label else [])])
    atomic_write(path, _csv(lines))


def _csv(rows: list) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def _toml(preset: str, names: list[str], active: str, protocol: str, seed: int, pins: dict[str, str],
          validation_fraction: float) -> str:
    parties = "".join(f'\n[[party]]\nname = "{n}"\ntrain = "{n}/train.csv"\npredict = "{n}/predict.csv"\n'
                      f'model = "{n}/model"\nkey = "{pins[n]}"\n' for n in names)
    return (f'# A demo federation written by `python -m falsevfl_secure.federation demo` ({preset}).\n'
            '# Every key is explained in docs/federation-toml.md. One operator plays every role here; with one\n'
            "# host per party, each party's own file names only its own paths (docs/federation-examples.md).\n"
            f'[federation]\nactive = "{active}"\nprotocol = "{protocol}"\nid_column = "id"\nlabel_column = "label"\n'
            f'task = "classification"\nrendezvous = "127.0.0.1:29611"\n'
            f"validation_fraction = {validation_fraction!r}  # labeled records held out to measure the model "
            "(0: every labeled record trains, as in `simulate`)\n"
            f'\n[model]\npreset = "{preset}"\nseed = {seed}\n{parties}'
            f"\n[aggregator]\naddress = \"127.0.0.1:29612\"\nkey = \"{pins['aggregator']}\"\n")
