"""What every command line of this package does with an expected failure: one `error:` line, an exit code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .errors import FalseVflError, PartyFailure


def guarded(command: Callable[[], int], resumable: bool = False) -> int:
    """Run `command`; bad input (2), a failed party (3), an unwritable file (2) and Ctrl-C (130) end with one
    line on stderr instead of a traceback (`resumable`: Ctrl-C's says how to go on). Anything else is a bug and
    keeps its traceback."""
    try:
        return command()
    except (FalseVflError, PartyFailure) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, FalseVflError) else 3
    except BrokenPipeError:  # the reader left (`| head`): nothing more to say, and nothing to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as error:
        print(f"error: {error.filename or ''}: {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # on a line of its own: a progress bar may hold the line
        print("\ninterrupted" + (": the checkpoints of every completed epoch are kept; the same command with "
                                  "--resume goes on from the last one" if resumable else ""), file=sys.stderr)
        return 130
