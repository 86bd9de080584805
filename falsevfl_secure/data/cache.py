"""A disk cache of loaded, standardised datasets.

Every party process of a simulated federation loads the same public dataset: Fashion-MNIST takes about
4 s to decompress, parse and standardise, most of a short distributed run's start-up on 2 cores; from the
cache it takes a fraction of a second. The key covers everything the arrays follow from: the dataset, its
loading options, the bytes of every file in its folder and the loader's own code, so an edited file or
loader never reads a stale copy. A cache file that cannot be read is rebuilt; one that cannot be written is
skipped (the cache only saves time). `FALSEVFL_CACHE` names the folder (default ~/.cache/falsevfl_secure);
`FALSEVFL_CACHE=off` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

ENV = "FALSEVFL_CACHE"
CODE = ("loaders.py", "standardize.py", "cache.py")  # the modules the cached arrays follow from
FORMAT = 1  # bumped when what a cache file holds changes
KEEP = 3  # cache files kept per dataset (a checkout of other code may share the folder)


def folder() -> Path | None:
    """The cache folder, or None when `FALSEVFL_CACHE` turns the cache off."""
    value = os.environ.get(ENV, "")
    if value.lower() in ("off", "0", "none", "false"):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "falsevfl_secure"


def key(name: str, options: tuple, sources: Path) -> str:
    """A digest of what the arrays follow from: options, every source file's bytes, the loading code."""
    digest = hashlib.sha256(repr((FORMAT, name, options)).encode())
    for path in sorted(p for p in sources.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(sources)).encode() + b"\0")
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    here = Path(__file__).resolve().parent
    for module in CODE:
        digest.update((here / module).read_bytes())
    return digest.hexdigest()[:32]


def arrays(name: str, options: tuple, sources: Path, build: Callable[[], dict[str, np.ndarray]]
           ) -> dict[str, np.ndarray]:
    """The arrays `build` returns for this dataset, from the cache when it holds them, else built and stored."""
    base = folder()
    if base is None:
        return build()
    path = base / f"{name}-{key(name, options, sources)}.npz"
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {field: stored[field] for field in stored.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # absent or unreadable: build it again
    built = build()
    _store(path, built)
    return built


def _store(path: Path, values: dict[str, np.ndarray]) -> None:
    """Write atomically (a reader never sees half a file); a folder that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False)
    except OSError:
        return
    try:
        with handle:
            np.savez(handle, **values)
        os.replace(handle.name, path)
    except OSError:
        Path(handle.name).unlink(missing_ok=True)
        return
    _prune(path)


def _prune(kept: Path) -> None:
    """Keep the KEEP newest files of a dataset: older code or data left the others behind."""
    name = kept.name.rsplit("-", 1)[0]
    files = sorted(kept.parent.glob(f"{name}-*.npz"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in (f for f in files[KEEP:] if f != kept and f.name.rsplit("-", 1)[0] == name):
        old.unlink(missing_ok=True)
