"""The disk cache of loaded datasets (data/cache.py): the same arrays as a fresh load, never a stale copy
after a source file or option changes, rebuilt when damaged, off when asked, and harmless when it cannot
be written."""

from __future__ import annotations

import numpy as np
import pytest
from test_data_loaders import write_hapt

from falsevfl_secure.data import cache, loaders

FIELDS = ("x_train", "y_train", "x_test", "y_test")


def fresh(root, **kw):
    loaders._load_cached.cache_clear()  # what another process would see: the disk cache only
    return loaders.load_dataset("hapt", root=root, **kw)


def same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS) and (a.n_classes, a.image_shape) == (
        b.n_classes, b.image_shape)


@pytest.fixture
def store(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV, str(folder))
    yield folder
    loaders._load_cached.cache_clear()


def test_a_cached_load_is_the_fresh_load_read_only(tmp_path, store, monkeypatch):
    write_hapt(tmp_path / "data")
    first = fresh(tmp_path / "data")
    assert len(list(store.glob("hapt-*.npz"))) == 1
    again = fresh(tmp_path / "data")
    monkeypatch.setenv(cache.ENV, "off")
    assert same(first, again) and same(again, fresh(tmp_path / "data"))
    assert not any(getattr(again, f).flags.writeable for f in FIELDS)


def test_a_changed_file_or_option_never_reads_the_stale_copy(tmp_path, store):
    write_hapt(tmp_path / "data", seed=0)
    before = fresh(tmp_path / "data")
    write_hapt(tmp_path / "data", seed=1)  # same names and sizes, other values
    after = fresh(tmp_path / "data")
    assert not np.array_equal(before.x_train, after.x_train)
    raw = fresh(tmp_path / "data", standardize="none")
    assert not np.array_equal(after.x_train, raw.x_train)
    assert len(list(store.glob("hapt-*.npz"))) == 3


def test_a_damaged_cache_file_is_rebuilt(tmp_path, store):
    write_hapt(tmp_path / "data")
    first = fresh(tmp_path / "data")
    (path,) = store.glob("hapt-*.npz")
    path.write_bytes(path.read_bytes()[:1000])
    assert same(first, fresh(tmp_path / "data"))
    assert path.stat().st_size > 1000


def test_off_writes_nothing_and_an_unwritable_folder_only_costs_time(tmp_path, monkeypatch):
    write_hapt(tmp_path / "data")
    monkeypatch.setenv(cache.ENV, "off")
    plain = fresh(tmp_path / "data")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache.ENV, str(blocker / "cache"))
    assert same(plain, fresh(tmp_path / "data"))
    loaders._load_cached.cache_clear()


def test_only_the_newest_files_of_a_dataset_are_kept(tmp_path, store):
    for seed in range(cache.KEEP + 2):
        write_hapt(tmp_path / "data", seed=seed)
        fresh(tmp_path / "data")
    assert len(list(store.glob("hapt-*.npz"))) == cache.KEEP
