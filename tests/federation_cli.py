"""The `federation` command line in this process: its exit code, standard output and standard error."""

from __future__ import annotations

import contextlib
import io

from falsevfl_secure.federation.__main__ import main


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()
