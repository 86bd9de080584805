"""The one way this package writes a file: atomically, so a killed run never leaves half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path | str, data: bytes | str) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename.

    Readers see the old file or the new one, never a truncated one. Parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path | str, record: object) -> None:
    """`record` as indented JSON, written atomically."""
    atomic_write(path, json.dumps(record, indent=2) + "\n")
