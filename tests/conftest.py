"""Session-wide test helpers: the bad-input report and the attack report.

Every bad-input test calls `refused(kind)` once per bad input it saw refused with a documented error
(hypothesis tests: once per example), and `make test` ends with a count per kind, so a reviewer sees
how many cases were exercised, not just how many test functions passed. Every attack test calls
`attacked(...)` with what its adversary measured, and `make test` ends with one line per attack and build,
so the numbers behind each privacy claim are printed by the run that checks them."""

from __future__ import annotations

import collections
import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

# Tests run several processes of a federation on one machine (one per party, each a "host"): one compute thread
# each, set before torch is imported anywhere (torch's default of one per core oversubscribed the two cores of CI:
# the suite ran 633 s with it and 568 s without).
os.environ.setdefault("OMP_NUM_THREADS", "1")

CACHE_ENV = "FALSEVFL_CACHE"  # data/cache.py's (not imported here: the test process stays as lean as before)
_CACHE: list[str] = []


LOCKS_ENV = "FALSEVFL_TEST_LOCKS"  # the folder of `machine_share`'s lock files, made by the xdist controller


def pytest_configure(config):
    """One dataset cache for the session (its processes share it), never the user's own; with xdist, one
    folder for the workers' lock files (`machine_share`; the workers inherit both through the environment)."""
    if CACHE_ENV not in os.environ:
        _CACHE.append(tempfile.mkdtemp(prefix="falsevfl-cache-"))
        os.environ[CACHE_ENV] = _CACHE[0]
    if LOCKS_ENV not in os.environ and getattr(config.option, "numprocesses", None):
        _CACHE.append(tempfile.mkdtemp(prefix="falsevfl-test-locks-"))
        os.environ[LOCKS_ENV] = _CACHE[-1]


def pytest_unconfigure(config):
    for folder in _CACHE:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items) -> None:
    """`timed` tests last (a stable sort: the rest keep their order). A timed test waits until no other test
    runs (`machine_share`), so in the middle of the run it held its worker idle for as long as the other
    worker's current test had left (28 s behind a netns federation); at the end only timed tests are left."""
    items.sort(key=lambda item: item.get_closest_marker("timed") is not None)

REFUSED = pytest.StashKey[collections.Counter]()
ATTACKS = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def refused(request):
    """`refused("cli")`: one more bad input of that kind was refused with a documented error."""
    counter = request.config.stash.setdefault(REFUSED, collections.Counter())

    def record(kind: str) -> None:
        counter[kind] += 1

    return record


@pytest.fixture(scope="session")
def attacked(request):
    """`attacked(attack, build, measured)`: what one adversary achieved against one build."""
    lines = request.config.stash.setdefault(ATTACKS, [])

    def record(attack: str, build: str, measured: str) -> None:
        lines.append((attack, build, measured))

    return record


@pytest.fixture(scope="session")
def sessions():
    """`sessions(protocol, parties)`: a `StepSession` kept alive across tests (one per protocol; a request
    with another K replaces it), so process start-up and protocol set-up are paid once."""
    from falsevfl_secure.runtime.session import StepSession

    open_: dict[str, StepSession] = {}

    def get(protocol: str, parties: int) -> StepSession:
        current = open_.get(protocol)
        if current is not None and current.parties != parties:
            current.close()
            current = None
        if current is None:
            current = open_[protocol] = StepSession(protocol, parties).__enter__()
        return current

    yield get
    for session in open_.values():
        session.close()


@pytest.fixture
def terminal_ctrl_c():
    """Children started in this test get SIGINT as at an interactive terminal.

    A non-interactive shell that starts a command in the background (`make test &`, `( ... & )`,
    some CI runners) sets SIGINT to *ignored*, and an ignored signal stays ignored across fork and
    exec: a launcher we interrupt would never see the Ctrl-C, and the test would fail for a reason
    outside the code under test. With a handler installed here, exec resets it to the default in
    the children, and Python installs KeyboardInterrupt there as it does at a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def denormals_restored():
    """A run flushes denormal floats in its process (`node.flush_denormals`); hypothesis refuses to draw floats
    where they are flushed, so each test leaves the pytest process as it found it."""
    yield
    if "torch" in sys.modules:
        sys.modules["torch"].set_flush_denormal(False)


@pytest.fixture(autouse=True)
def machine_share(request):
    """Under pytest-xdist (`make test` runs two workers), a test marked `timed` (its assertion bounds a wall
    time, process start-up included) runs with no other test beside it; others share the machine.

    A fair readers-writer lock over two flock files of this run: every test passes the turnstile, then holds
    the room shared; a timed test holds the turnstile (no new test starts) until the room is its own."""
    if "PYTEST_XDIST_WORKER" not in os.environ or LOCKS_ENV not in os.environ:
        yield
        return
    folder = Path(os.environ[LOCKS_ENV])
    timed = request.node.get_closest_marker("timed") is not None
    with open(folder / "turnstile", "a") as turnstile, open(folder / "room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if timed else fcntl.LOCK_SH)
        if not timed:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # both files close (and unlock) after the test


def pytest_sessionfinish(session) -> None:
    """An xdist worker hands its reports to the controller (`pytest_testnodedown`)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["attacks"] = json.dumps(session.config.stash.get(ATTACKS, []))
        out["refused"] = json.dumps(dict(session.config.stash.get(REFUSED, {})))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """The controller merges each worker's attack and bad-input reports into its own."""
    out = getattr(node, "workeroutput", {})
    node.config.stash.setdefault(ATTACKS, []).extend(tuple(line) for line in json.loads(out.get("attacks", "[]")))
    node.config.stash.setdefault(REFUSED, collections.Counter()).update(json.loads(out.get("refused", "{}")))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    attacks = config.stash.get(ATTACKS, None)
    if attacks:
        terminalreporter.section("attack report")
        for attack, build, measured in attacks:
            terminalreporter.write_line(f"  {attack:<44}{build:<28}{measured}")
    counter = config.stash.get(REFUSED, None)
    if not counter:
        return
    terminalreporter.section("bad-input report")
    terminalreporter.write_line(f"{sum(counter.values())} bad inputs refused with a documented error type:")
    for kind, count in sorted(counter.items()):
        terminalreporter.write_line(f"  {kind:<28}{count:>6}")
