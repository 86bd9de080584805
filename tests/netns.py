"""Throw-away multi-host networks made of Linux network namespaces, for tests of the multi-host path.

    from netns import available, hosts   # tests/ is on sys.path under pytest, as for the other helpers

    ok, reason = available()          # (False, why) when namespaces cannot be made here
    with hosts(3) as hs:              # three "machines" on one private /24
        h = hs[0]                     # Host(name='fv4242qz-0', address='10.242.17.1', interface='fv4242qz0')
        p = h.popen([sys.executable, "-c", "..."], env=h.env(RANK="0"))
    # every namespace, veth, the bridge and every process started in them are gone here

Topology: each host is a network namespace with loopback up and one veth interface `host.interface`
holding `host.address`/24. The other ends of all veths are ports of one bridge that lives in a
namespace of its own, so nothing is ever created in (or routed to) the root namespace: a host can
reach the other hosts and nothing else (not the machine's loopback services, not its real network).
The /24 is drawn at random from 10.200.0.0-10.249.255.0 (second octet from the PID); since every run
has its own bridge namespace, two runs that draw the same /24 still cannot see each other.

Names: one tag per run, `<prefix><pid><2 random letters>` (prefix: 1-3 lower-case letters, default
"fv"; the pid in decimal, so a name parses back unambiguously). Namespaces are `<tag>-<i>` and
`<tag>-br`; the host interface is `<tag><i>` (at most 3+7+2+3 = 15 characters, the Linux limit for
an interface name). The tag is unique per run: `ip netns add` refuses an existing name, and then
another tag is drawn. Inside the private bridge namespace the names are fixed (`br0`, `p<i>`).

Teardown (also after an exception, KeyboardInterrupt included; a Ctrl-C during teardown is held back
until it has finished): every process started with `Host.popen` is killed and reaped, every process
still running in one of the namespaces (`ip netns pids`) is killed, then every namespace is deleted,
which destroys its veth ends and the bridge. A run that was SIGKILLed cannot clean up; the next
`hosts()` with the same prefix deletes namespaces whose tag names a PID that no longer exists
(`sweep_stale`).

Blocking inbound connections (`Host.block_inbound`): an nftables rule in the host's namespace drops every
new connection that arrives on its interface, while connections it opens itself (and their replies) pass:
the firewall of an institution that only allows outbound traffic. The rule lives and dies with the
namespace.

Running a role of a federation inside a namespace needs nothing special: its hub listens on the host's
address (or it only dials out), and the hosts reach each other over the bridge. Harmless noise: a
namespace has no DNS, so anything that resolves names fails fast.
When the peers cannot connect, a role can wait until its join timeout: bound every process with a
wall-clock deadline.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Host", "available", "hosts", "netns_names", "sweep_stale"]

IP = "ip"
IFNAMSIZ = 15  # longest interface name Linux accepts
MAX_HOSTS = 250
DEFAULT_PREFIX = "fv"
_CMD_TIMEOUT_S = 10.0
_used_tags: set[str] = set()
_tags_lock = threading.Lock()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip ARGS`; with check, a failure raises RuntimeError with ip's own message."""
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=_CMD_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_names() -> list[str]:
    """The names `ip netns list` shows (it prints "name" or "name (id: 3)")."""
    return [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]


def _netns_pids(name: str) -> list[int]:
    return [int(tok) for tok in _ip("netns", "pids", name, check=False).stdout.split() if tok.isdigit()]


def _check_prefix(prefix: str | None) -> str:
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    if not re.fullmatch(r"[a-z]{1,3}", prefix):
        raise ValueError(f"prefix must be 1-3 lower-case letters, not {prefix!r}")
    return prefix


def _new_tag(prefix: str) -> str:
    with _tags_lock:
        while True:
            tag = f"{prefix}{os.getpid()}{''.join(random.choices(string.ascii_lowercase, k=2))}"
            if tag not in _used_tags:
                _used_tags.add(tag)
                return tag


@dataclass(frozen=True)
class Host:
    """One namespace of a `hosts()` network: `name` (the namespace), `address` (IPv4, on a /24),
    `interface` (its only interface besides loopback) and `index` (its position in the list)."""

    name: str
    address: str
    interface: str
    index: int = 0
    _started: list = field(default_factory=list, repr=False, compare=False)

    def command(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """argv run inside this host: `ip netns exec NAME [env K=V ...] ARGV...`, for a launcher that
        takes a command line (`ip netns exec` keeps the caller's environment and execs ARGV, so the
        pid of the started process is ARGV's own)."""
        prefix = [IP, "netns", "exec", self.name]
        if env:
            prefix += ["env", *(f"{k}={v}" for k, v in env.items())]
        return prefix + [os.fspath(a) for a in argv]

    def env(self, base: Mapping[str, str] | None = None, **extra: object) -> dict[str, str]:
        """A process environment for this host: `base` (default os.environ), then `extra` (e.g. RANK=0)."""
        env = dict(os.environ if base is None else base)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def block_inbound(self) -> None:
        """Drop every new inbound connection on this host's interface (outbound ones and replies pass)."""
        table = ("add table inet fv; add chain inet fv input { type filter hook input priority 0; policy accept; }; "
                 f"add rule inet fv input iifname {self.interface} ct state new drop")
        proc = subprocess.run([IP, "netns", "exec", self.name, "nft", table], capture_output=True, text=True,
                              timeout=_CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"nft in {self.name} failed ({proc.returncode}): {proc.stderr.strip()}")

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """subprocess.Popen of argv inside this host (keywords as for Popen). Killed and reaped at teardown if
        still running."""
        proc = subprocess.Popen(self.command(argv), **kw)
        self._started.append(proc)
        return proc

    def run(self, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run of argv inside this host (pass timeout= to bound it)."""
        return subprocess.run(self.command(argv), **kw)


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, "") when network namespaces with veths and a bridge can be made here, else (False, why).
    Probes once per process (creates and deletes one namespace)."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root (euid is not 0)"
    if shutil.which(IP) is None:
        return False, "the `ip` command (iproute2) is not installed"
    name = f"{_new_tag(DEFAULT_PREFIX)}-probe"
    try:
        _ip("netns", "add", name)
        try:
            _ip("-n", name, "link", "add", "br0", "type", "bridge")
            _ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
            _ip("-n", name, "link", "set", "v1", "master", "br0")
            proc = subprocess.run([IP, "netns", "exec", name, "true"], capture_output=True, text=True,
                                  timeout=_CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                return False, f"`ip netns exec` does not work here: {proc.stderr.strip()}"
        finally:
            _ip("netns", "del", name, check=False)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return False, f"cannot create network namespaces here: {exc}"
    return True, ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_in(names: Sequence[str], deadline_s: float = 5.0) -> list[str]:
    """SIGKILL every process in the namespaces until none is left; a problem per namespace that still
    has processes at the deadline. (A killed process leaves `ip netns pids` as soon as it is dead,
    reaped or not: a zombie has no namespaces any more.)"""
    end = time.monotonic() + deadline_s
    pending = list(names)
    while True:
        still = []
        for name in pending:
            pids = _netns_pids(name)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if pids:
                still.append(name)
        pending = still
        if not pending:
            return []
        if time.monotonic() > end:
            return [f"processes still running in {n}: {_netns_pids(n)}" for n in pending]
        time.sleep(0.02)


def _delete(names: Sequence[str]) -> list[str]:
    problems = []
    for name in names:
        proc = _ip("netns", "del", name, check=False)
        if proc.returncode != 0 and name in netns_names():
            problems.append(f"could not delete namespace {name}: {proc.stderr.strip()}")
    return problems


def sweep_stale(prefix: str | None = None) -> list[str]:
    """Delete the namespaces left by `hosts()` runs with this prefix whose process no longer exists
    (e.g. a test run that was SIGKILLed); returns their names. A run whose pid is alive is left alone."""
    prefix = _check_prefix(prefix)
    pattern = re.compile(rf"{prefix}(\d+)[a-z]{{2}}-(?:br|probe|\d+)")
    stale = [name for name in netns_names()
             if (m := pattern.fullmatch(name)) and not _pid_alive(int(m.group(1)))]
    if stale:
        _kill_in(stale)
        _delete(stale)
    return stale


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Hold a Ctrl-C back while cleaning up, then raise it as KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class _Network:
    def __init__(self, n: int, prefix: str, ipv6: bool):
        self.n, self.prefix, self.ipv6 = n, prefix, ipv6
        self.created: list[str] = []  # namespaces that may exist, in creation order
        self.started: list[subprocess.Popen] = []
        self.hosts: list[Host] = []

    def _add_netns(self, name: str) -> bool:
        # recorded before `ip netns add` runs, so that an interrupt in between cannot leak it
        self.created.append(name)
        proc = _ip("netns", "add", name, check=False)
        if proc.returncode != 0:
            self.created.remove(name)  # it may be someone else's: never delete it
        return proc.returncode == 0

    def setup(self) -> None:
        for _ in range(20):  # an existing name (another run) draws another tag
            tag = _new_tag(self.prefix)
            bridge_ns = f"{tag}-br"
            if self._add_netns(bridge_ns):
                break
        else:
            raise RuntimeError(f"could not create a bridge namespace (last tried {bridge_ns})")
        assert len(f"{tag}{self.n - 1}") <= IFNAMSIZ, tag
        _ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge_ns, "link", "set", "br0", "up")
        subnet = f"10.{200 + os.getpid() % 50}.{random.randrange(256)}"
        for i in range(self.n):
            ns, iface, peer = f"{tag}-{i}", f"{tag}{i}", f"p{i}"
            if not self._add_netns(ns):
                raise RuntimeError(f"could not create namespace {ns}")
            if not self.ipv6:
                self._disable_ipv6(ns)
            # both ends are created directly in their namespaces: nothing ever appears in the root one
            _ip("link", "add", iface, "netns", ns, "type", "veth", "peer", "name", peer, "netns", bridge_ns)
            _ip("-n", bridge_ns, "link", "set", peer, "master", "br0", "up")
            address = f"{subnet}.{i + 1}"
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", iface)
            _ip("-n", ns, "link", "set", iface, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.hosts.append(Host(ns, address, iface, i, self.started))

    @staticmethod
    def _disable_ipv6(ns: str) -> None:
        if not os.path.exists("/proc/sys/net/ipv6"):
            return
        script = " && ".join(f"echo 1 > /proc/sys/net/ipv6/conf/{k}/disable_ipv6" for k in ("all", "default"))
        proc = subprocess.run([IP, "netns", "exec", ns, "sh", "-c", script], capture_output=True, text=True,
                              timeout=_CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"cannot switch IPv6 off in {ns}: {proc.stderr.strip()}")

    def teardown(self) -> list[str]:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        problems = _kill_in(self.created)
        for proc in self.started:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                problems.append(f"process {proc.pid} ({proc.args}) did not exit after SIGKILL")
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        problems += _delete(list(reversed(self.created)))  # hosts first, the bridge namespace last
        return problems


@contextlib.contextmanager
def hosts(n: int, prefix: str | None = None, *, ipv6: bool = False) -> Iterator[list[Host]]:
    """n network namespaces on one private /24 behind a bridge (in a namespace of its own); yields their
    `Host` records, host i at x.y.z.(i+1). Everything is removed on exit (see the module docstring);
    a teardown that could not remove everything raises RuntimeError (only warns when the body raised).
    `ipv6=True` leaves IPv6 on (each interface then also gets a link-local fe80:: address)."""
    if not isinstance(n, int) or not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"n must be an int from 1 to {MAX_HOSTS}, not {n!r}")
    prefix = _check_prefix(prefix)
    ok, reason = available()
    if not ok:
        raise RuntimeError(reason)
    sweep_stale(prefix)
    net = _Network(n, prefix, ipv6)
    completed = False
    try:
        net.setup()
        yield list(net.hosts)
        completed = True
    finally:
        with _sigint_held():
            problems = net.teardown()
        if problems:
            message = "netns teardown incomplete: " + "; ".join(problems)
            if completed:
                raise RuntimeError(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
