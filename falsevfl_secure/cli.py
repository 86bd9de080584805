"""What every command line of this package does with an expected failure: one `error:` line, an exit code."""

from __future__ import annotations

import argparse
import io
import os
import select
import sys
from collections.abc import Callable

from .errors import FalseVflError, PartyFailure

RESUME = ("a run that completed an epoch goes on from each party's last checkpoint with the same command and "
          "--resume (not under a privacy budget: it would release rows again)")


class Parser(argparse.ArgumentParser):
    """argparse's refusal of a command line as this package's: one `error:` line (no usage before it), exit 2.
    Subcommands' parsers are of the same class (`add_subparsers` makes them so)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def guarded(command: Callable[[], int], resumable: bool = False) -> int:
    """Run `command`; bad input (2), a failed party (3), an unwritable file (2) and Ctrl-C (130) end with one
    line on stderr instead of a traceback (`resumable`: Ctrl-C's says how to go on); a reader of stdout that
    left (`| head`) ends it quietly (141). Anything else is a bug and keeps its traceback."""
    try:
        code = command()
        sys.stdout.flush()  # a reader that left is seen here, not in the interpreter's last flush
        return code
    except (FalseVflError, PartyFailure) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, FalseVflError) else 3
    except OSError as error:
        if isinstance(error, BrokenPipeError) and _stdout_gone():
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
            return 141
        print(f"error: {error.filename or ''}: {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # on a line of its own: a progress bar may hold the line
        print("\ninterrupted" + (f": {RESUME}" if resumable else ""), file=sys.stderr)
        return 130


def _stdout_gone() -> bool:
    """Whether this process's stdout is a pipe its reader closed (another broken pipe is an error to report)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
