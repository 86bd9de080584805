"""The one way this package writes a file: atomically, so a killed run never leaves half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


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
        if not private:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path | str, record: object) -> None:
    """`record` as indented JSON, written atomically."""
    atomic_write(path, json.dumps(record, indent=2) + "\n")
