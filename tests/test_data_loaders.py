"""Loaders: official counts and classes, training-set standardisation, checksums, errors, HAPT layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from falsevfl_secure.data import DataError, data_root, load_dataset

ROOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
HAS_ISOLET = (ROOT / "isolet" / "isolet5.data.gz").is_file()
HAS_FMNIST = (ROOT / "fashion-mnist" / "train-images-idx3-ubyte.gz").is_file()
needs_isolet = pytest.mark.skipif(not HAS_ISOLET, reason="Isolet files not in ../shared/data")
needs_fmnist = pytest.mark.skipif(not HAS_FMNIST, reason="Fashion-MNIST files not in ../shared/data")


def write_hapt(root: Path, n_train: int = 40, n_test: int = 24, features: int = 561, seed: int = 0) -> Path:
    """A small HAPT fixture in UCI's exact layout and number format (`%.7e`, 3-digit exponent)."""
    rng = np.random.default_rng(seed)
    for split, n in (("Train", n_train), ("Test", n_test)):
        folder = root / "hapt" / split
        folder.mkdir(parents=True, exist_ok=True)
        x = rng.uniform(-1, 1, size=(n, features))
        x[:, 3] = 0.5  # a constant feature: std must become 1, not 0
        y = np.arange(n) % 12 + 1
        lines = []
        for row in x:
            cells = []
            for v in row:
                mantissa, exponent = f"{v:.7e}".split("e")
                cells.append(f"{mantissa}e{int(exponent):+04d}")
            lines.append(" " + " ".join(cells) + " ")  # stray leading/trailing blanks are tolerated
        (folder / f"X_{split.lower()}.txt").write_text("\n".join(lines) + "\n")
        (folder / f"y_{split.lower()}.txt").write_text("\n".join(str(v) for v in y) + "\n")
    return root


def _check_standardised(data) -> None:
    assert data.x_train.dtype == np.float32 and data.x_test.dtype == np.float32
    assert data.y_train.dtype == np.int64
    assert np.isfinite(data.x_train).all() and np.isfinite(data.x_test).all()
    mean = data.x_train.mean(axis=0, dtype=np.float64)
    std = data.x_train.std(axis=0, dtype=np.float64)
    assert np.abs(mean).max() < 1e-4
    # scale = max(std, range / 10): std 1 unless the floor bit (near-constant features, heavy tails); 0 if constant
    assert (std <= 1.0 + 1e-3).all() and (std > 0.999).mean() > 0.5
    assert np.abs(data.x_train).max() <= 10.0 and np.abs(data.x_test).max() <= 10.0
    assert not data.x_train.flags.writeable and not data.y_test.flags.writeable


def test_digits_counts_and_split():
    data = load_dataset("digits")
    assert len(data.y_train) + len(data.y_test) == 1797
    assert data.x_train.shape[1] == 64 and data.n_classes == 10 and data.image_shape == (8, 8)
    assert abs(len(data.y_test) / 1797 - 0.25) < 0.01
    assert set(np.unique(data.y_train)) == set(range(10))
    _check_standardised(data)
    assert load_dataset("digits", seed=0) is data  # cached
    other = load_dataset("digits", seed=1)
    assert not np.array_equal(other.y_train, data.y_train)


def test_arrays_are_read_only():
    data = load_dataset("digits")
    with pytest.raises(ValueError):
        data.x_train[0, 0] = 1.0


@needs_isolet
def test_isolet_counts_classes_and_standardisation():
    data = load_dataset("isolet")
    assert data.x_train.shape == (6238, 617) and data.x_test.shape == (1559, 617)
    assert data.n_classes == 26 and data.image_shape is None
    train_counts = np.bincount(data.y_train, minlength=26)
    test_counts = np.bincount(data.y_test, minlength=26)
    assert train_counts[5] == 238 and np.all(np.delete(train_counts, 5) == 240)
    assert test_counts[12] == 59 and np.all(np.delete(test_counts, 12) == 60)
    _check_standardised(data)
    # the test set is standardised with the TRAINING statistics: recompute from the raw files
    import pandas as pd

    raw_train = pd.read_csv(ROOT / "isolet" / "isolet1+2+3+4.data.gz", header=None).to_numpy()[:, :-1]
    raw_test = pd.read_csv(ROOT / "isolet" / "isolet5.data.gz", header=None).to_numpy()[:, :-1]
    mean, std = raw_train.mean(axis=0), raw_train.std(axis=0)
    scale = np.maximum(std, (raw_train.max(axis=0) - raw_train.min(axis=0)) / 10)  # the documented floor
    assert np.allclose(data.x_test, np.clip((raw_test - mean) / scale, -10, 10), atol=1e-4)
    assert not np.allclose(data.x_test.mean(axis=0), 0.0, atol=1e-4)  # not re-centred on its own stats


@needs_fmnist
def test_fashion_mnist_counts_and_aliases():
    data = load_dataset("fashion-mnist")
    assert data.x_train.shape == (60000, 784) and data.x_test.shape == (10000, 784)
    assert data.image_shape == (28, 28) and data.n_classes == 10
    assert np.all(np.bincount(data.y_train) == 6000) and np.all(np.bincount(data.y_test) == 1000)
    _check_standardised(data)
    assert load_dataset("fmnist") is data and load_dataset("fashion_mnist") is data


def test_unknown_dataset(refused):
    with pytest.raises(DataError, match="valid names"):
        load_dataset("mnist")
    refused("dataset file or name")


def test_missing_file_names_path(tmp_path):
    with pytest.raises(DataError) as info:
        load_dataset("isolet", root=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "isolet" / "isolet1+2+3+4.data.gz") in message and "FALSEVFL_DATA" in message


def test_data_root_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FALSEVFL_DATA", str(tmp_path))
    assert data_root() == tmp_path.resolve()
    monkeypatch.setenv("FALSEVFL_DATA", str(tmp_path / "nope"))
    with pytest.raises(DataError, match="FALSEVFL_DATA"):
        data_root()


@needs_isolet
def test_checksum_mismatch(tmp_path, refused):
    folder = tmp_path / "isolet"
    folder.mkdir()
    for name in ("isolet1+2+3+4.data.gz", "isolet5.data.gz"):
        shutil.copy(ROOT / "isolet" / name, folder / name)
    target = folder / "isolet5.data.gz"
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    target.write_bytes(bytes(raw))
    with pytest.raises(DataError) as info:
        load_dataset("isolet", root=tmp_path)
    refused("dataset file or name")
    message = str(info.value)
    assert "checksum mismatch" in message and str(target) in message
    assert "3bf63a31fe454d3d28cf491823b32e36dad9b0b0fe78548555c6c2b6077a0f5a" in message


def test_hapt_fixture_loads(tmp_path):
    write_hapt(tmp_path)
    data = load_dataset("hapt", root=tmp_path)
    assert data.x_train.shape == (40, 561) and data.x_test.shape == (24, 561)
    assert data.n_classes == 12 and data.y_train.min() == 0 and data.y_train.max() == 11
    _check_standardised(data)
    assert np.all(data.x_train[:, 3] == 0)
    with pytest.raises(DataError, match="official 7767"):
        load_dataset("hapt", root=tmp_path, strict_counts=True)


def test_hapt_wrong_columns(tmp_path, refused):
    write_hapt(tmp_path, features=560)
    with pytest.raises(DataError, match="X_train.txt.*561"):
        load_dataset("hapt", root=tmp_path)
    refused("dataset file or name")


def test_hapt_bad_labels_and_nan(tmp_path, refused):
    write_hapt(tmp_path)
    labels = tmp_path / "hapt" / "Test" / "y_test.txt"
    labels.write_text(labels.read_text().replace("12\n", "13\n"))
    with pytest.raises(DataError, match="y_test.txt"):
        load_dataset("hapt", root=tmp_path)
    refused("dataset file or name")
    write_hapt(tmp_path)
    x = tmp_path / "hapt" / "Train" / "X_train.txt"
    text = x.read_text().split(" ", 1)
    x.write_text("NaN " + text[1])
    with pytest.raises(DataError, match="X_train.txt"):
        load_dataset("hapt", root=tmp_path)
    refused("dataset file or name")


def test_hapt_row_mismatch(tmp_path, refused):
    write_hapt(tmp_path)
    labels = tmp_path / "hapt" / "Train" / "y_train.txt"
    labels.write_text("\n".join(labels.read_text().split("\n")[:-2]) + "\n")
    with pytest.raises(DataError, match="rows"):
        load_dataset("hapt", root=tmp_path)
    refused("dataset file or name")


def test_fmnist_bad_magic(tmp_path, refused):
    import gzip

    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        with gzip.open(folder / name, "wb") as handle:
            handle.write(b"\x00\x00\x08\x04" + b"\x00" * 16)
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz.*magic"):
        load_dataset("fashion-mnist", root=tmp_path, verify_checksums=False)
    refused("dataset file or name")
