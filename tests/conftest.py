"""Session-wide test helpers: the bad-input report.

Every bad-input test calls `refused(kind)` once per bad input it saw refused with a documented error
(hypothesis tests: once per example), and `make test` ends with a count per kind, so a reviewer sees
how many cases were exercised, not just how many test functions passed."""

from __future__ import annotations

import collections

import pytest

REFUSED = pytest.StashKey[collections.Counter]()


@pytest.fixture(scope="session")
def refused(request):
    """`refused("cli")`: one more bad input of that kind was refused with a documented error."""
    counter = request.config.stash.setdefault(REFUSED, collections.Counter())

    def record(kind: str) -> None:
        counter[kind] += 1

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    counter = config.stash.get(REFUSED, None)
    if not counter:
        return
    terminalreporter.section("bad-input report")
    terminalreporter.write_line(f"{sum(counter.values())} bad inputs refused with a documented error type:")
    for kind, count in sorted(counter.items()):
        terminalreporter.write_line(f"  {kind:<28}{count:>6}")
