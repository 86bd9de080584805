"""The one way this package writes a file: atomically, so a killed run never leaves half a file; and a run's
outputs staged beside their place (`staged`), moved into place only once the whole run has ended well
(`commit`) and dropped otherwise (`discard`), so a failed run leaves the previous ones as they were. A folder's
commit is journaled: one killed while it moved the files is finished by `settle`, never left half old, half new."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .errors import InputError

_UMASK = os.umask(0o077)  # read once at import, before any thread (setting it later is process-wide: a thread
os.umask(_UMASK)  # that made a folder meanwhile got 0777; review finding)


def atomic_write(path: Path | str, data: bytes | str, private: bool = False) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename.

    Readers see the old file or the new one, never a truncated one. Parent folders are created. The file
    gets the usual permissions (0666 less the umask), or owner-only ones when `private` (a party's
    checkpoint holds its secret).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # created 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())  # on disk before the rename: a power loss leaves the old file, not an empty one
            if not private:
                os.fchmod(handle.fileno(), 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)  # the rename itself on disk (a ledger's charge must survive a power loss)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # (a folder it may not read: the rename stands, its durability is the file system's)
        return
    try:
        os.fsync(fd)
    except OSError:  # (EINVAL: a file system that cannot sync a folder)
        pass
    finally:
        os.close(fd)


def staged(path: Path | str) -> Path:
    """Where a run writes `path` (a file, or a folder of files) until it has ended well: a hidden sibling,
    on the same file system, so that `commit` is a rename."""
    path = Path(path)
    return path.with_name(f".{path.name}.staged")


def read_regular(path: Path | str) -> bytes:
    """The bytes of a regular file; anything else (a FIFO, whose opening waits for a writer; a device; a folder) is
    an OSError, never a wait (a fuzzer's FIFO as the federation file hung `check`)."""
    return regular_file(path)[0]


def file_in_the_way(path: Path) -> Path | None:
    """The first of `path` and its parents that exists and is no folder (so no folder can be made at `path`)."""
    return next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)


def regular_file(path: Path | str) -> tuple[bytes, os.stat_result]:
    """`read_regular`'s bytes and the opened file's own status (its mode, read from the descriptor the bytes came
    from). Checked before opening too: opening a device can act (a watchdog arms, a tape rewinds)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        status = os.fstat(fd)  # (swapped since the check: refused all the same)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as handle:
            return handle.read(), status
    finally:
        os.close(fd)


def open_lock(lock: Path) -> int:
    """A lock file, opened for flock (created owner-only): never through a planted link, never blocking on a planted
    FIFO (review finding: a run waited forever for a reader); anything but a regular file is one error line."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as error:
        raise InputError(f"{lock}: this program's lock file cannot be opened ({error.strerror}); remove what is "
                         "there") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{lock} is not this program's lock file (not a regular file); remove it")
    return fd


def _journal(path: Path) -> Path:
    return path.with_name(f".{path.name}.committing")


def commit(path: Path | str) -> None:
    """Move what was staged for `path` into place: a file by one rename, a folder file by file (each
    replaced atomically; files the run did not write stay) after its journal says the commit has begun.
    Nothing staged: nothing changes."""
    path, source = Path(path), staged(path)
    if source.is_dir():
        atomic_write(_journal(path), b"")
        _move_in(source, path)
    elif source.exists():
        os.replace(source, path)


def _move_in(source: Path, path: Path) -> None:
    """Every file of `source` into `path`, then the journal dropped (a file another process moved is skipped:
    a `settle` running beside the commit)."""
    path.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir()):
        try:
            os.replace(item, path / item.name)
        except FileNotFoundError:
            pass
    shutil.rmtree(source, ignore_errors=True)
    _journal(path).unlink(missing_ok=True)
    _sync_folder(path)


def interrupted(path: Path | str) -> bool:
    """Whether a commit of the folder `path` was begun and not finished (its next run's `settle` finishes it)."""
    return _journal(Path(path)).exists()


def settle(path: Path | str) -> None:
    """Finish a folder's commit that a killed run began (its journal is there): review finding, a kill between
    two files' renames left a new manifest and networks beside the previous run's trees, which predict used."""
    path = Path(path)
    if not _journal(path).exists():
        return
    if staged(path).is_dir():
        _move_in(staged(path), path)
    else:
        _journal(path).unlink(missing_ok=True)


def discard(path: Path | str) -> None:
    """Drop what a run staged for `path` (a failed run's, or one killed before its commit)."""
    source = staged(path)
    if source.is_dir():
        shutil.rmtree(source)
    else:
        source.unlink(missing_ok=True)


def write_json(path: Path | str, record: object, private: bool = False) -> None:
    """`record` as indented JSON, written atomically (owner-only when `private`); numpy scalars and arrays as the
    numbers they hold (an audit's `numpy.bool_` once made `simulate --audit` fail at the very end)."""
    atomic_write(path, json.dumps(record, indent=2, default=_plain) + "\n", private=private)


def _plain(value: object) -> object:
    """JSON's stand-in for a numpy value (`item()` of a scalar, `tolist()` of an array); else refused."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return value.item()
    if hasattr(value, "tolist") and hasattr(value, "shape"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@contextlib.contextmanager
def saved_arrays(path: Path | str, what: str):
    """The arrays of an .npz file a training wrote (no pickle), read inside the block; a truncated, foreign or
    incomplete file is one error line naming it (review finding: BadZipFile and KeyError tracebacks)."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            yield saved
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
        raise InputError(f"{path}: not the {what} a training of this program wrote ({type(error).__name__}: "
                         f"{error}); train again") from error
