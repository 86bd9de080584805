"""What every command line of this package does with an expected failure: one `error:` line, an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .errors import FalseVflError, PartyFailure


def guarded(command: Callable[[], int]) -> int:
    """Run `command`; bad input (2), a failed party (3), an unwritable file (2) and Ctrl-C (130) end with one
    line on stderr instead of a traceback. Anything else is a bug and keeps its traceback."""
    try:
        return command()
    except (FalseVflError, PartyFailure) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, FalseVflError) else 3
    except OSError as error:
        print(f"error: {error.filename or ''}: {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
